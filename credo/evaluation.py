"""`credo eval MODEL RECIPE_OR_TASK`: a recipe's held-out evaluation on a saved model, for comparing models.

MODEL is a Hugging Face model folder (a run's `final/`, or any folder with config.json), a run folder holding
`final/`, or a credo checkpoint folder (`checkpoints/step_N`, read by `credo.export`: written merged into a
temporary folder first). RECIPE_OR_TASK is a recipe YAML, whose evaluator runs as in training (the task's held-out
split scored by its verifier or the recipe's reward functions, or an active family's evaluator such as the
multi-turn env's held-out episodes), or a task name (`arithmetic`, `rg:<name>`, ...) with the default recipe.

The evaluator is the one `credo run` builds (`credo.train.build.make_evaluator`), with the same seeds, rollout
backend and prompt rendering, so the eval of a run's `final/` gives the run's last logged eval metric.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

from credo.config import Recipe, load_recipe, validate_recipe
from credo.errors import ConfigError

log = logging.getLogger("credo")


def eval_recipe(recipe_or_task: str, overrides: list[str] | None = None) -> Recipe:
    """The recipe `recipe_or_task` names: a YAML file, or a task name run with the default recipe."""
    overrides = list(overrides or [])
    if recipe_or_task.endswith((".yaml", ".yml")) or Path(recipe_or_task).is_file():
        return load_recipe(recipe_or_task, overrides)
    return load_recipe(None, [f"run.name=eval-{recipe_or_task.replace(':', '-')}", f"task.name={recipe_or_task}",
                              *overrides])


def model_folder(model: str | Path, stack: ExitStack) -> Path:
    """The Hugging Face folder to evaluate: MODEL itself, its `final/`, or a checkpoint exported (merged) into a
    temporary folder that `stack` removes."""
    path = Path(model)
    if (path / "meta.json").is_file():  # a credo checkpoint: its policy, merged when it trained a LoRA adapter
        from credo.export import export_checkpoint

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="credo-eval-")))
        return export_checkpoint(path, tmp / "model")
    if not (path / "config.json").is_file() and (path / "final" / "config.json").is_file():
        path = path / "final"  # a run folder
    if not (path / "config.json").is_file():
        raise ConfigError(f"MODEL '{model}' is not a model folder: expected a Hugging Face model folder (config.json), "
                          "a run's final/ or run folder, or a checkpoint folder (checkpoints/step_N)")
    from credo.safe_load import check_model_folder

    check_model_folder(path)  # a pickled weight file holding code: refused here, whichever backend loads the folder
    return path


def saved_model_recipe(r: Recipe, folder: Path, *, samples: int | None, temperature: float | None) -> Recipe:
    """`r` for evaluating the model in `folder`: no warm-up, adapter or reference (the folder holds the whole
    policy), evaluation on, and run.eval_samples / run.eval_temperature overridden where given."""
    r = copy.deepcopy(r)
    r.model.path, r.sft.enabled = str(folder.resolve()), False
    r.model.lora.r, r.model.ref_model, r.algo.kl_coef, r.model.gradient_checkpointing = 0, False, 0.0, False
    r.run.eval_every = max(r.run.eval_every, 1)
    if temperature is not None:
        r.run.eval_temperature = temperature
    if samples is not None:
        r.run.eval_samples = samples
    if r.run.eval_temperature == 0 and samples is None:
        r.run.eval_samples = 1  # greedy decoding draws one sample
    validate_recipe(r)  # its names are resolved by the run plan (evaluate_model's preflight)
    return r


def evaluate_model(model: str | Path, recipe: Recipe, *, samples: int | None = None,
                   temperature: float | None = None) -> dict:
    """Run `recipe`'s evaluator on the saved model `model` (see the module docstring).

    Returns:
        {"metrics": {name: value}, "model": MODEL as given, "eval_samples", "eval_temperature", "samples":
        [{prompt, completion, score}] of the evaluator's kept samples (the first 16)}.
    """
    import torch

    from credo.distributed.engine import device
    from credo.models import check_vocab, load_causal_lm, load_tokenizer
    from credo.preflight import preflight
    from credo.tasks.render import prompt_renderer
    from credo.train.build import build_source, default_reward_fn, make_evaluator, run_task
    from credo.train.registry import StageContext
    from credo.train.setup import make_backend

    with ExitStack() as stack:
        folder = model_folder(model, stack)
        r = saved_model_recipe(recipe, folder, samples=samples, temperature=temperature)
        plan = preflight(r)
        for note in plan.notes:
            log.info(note)
        torch.set_num_threads(r.run.threads or max(1, os.cpu_count() or 1))
        task = run_task(plan)
        tokenizer = load_tokenizer(r.model.path)
        policy = None  # the hf backend samples with it; vLLM loads the folder itself (FP8 quantises it from here)
        if r.rollout.backend == "hf" or r.rollout.fp8_weights:
            policy = load_causal_lm(r.model.path, r.model.dtype).to(device())
            check_vocab(policy, tokenizer, r.model.path)
        ctx = StageContext(rank=0, world=1, recipe=r, tokenizer=tokenizer, task=task,
                           backend=make_backend(plan, SimpleNamespace(module=policy), tokenizer, r.model.path),
                           render=prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template),
                           policy_path=r.model.path)
        source = build_source(plan, ctx)
        stack.callback(source.close)
        evaluator = make_evaluator(plan, ctx, SimpleNamespace(source=source, reward_fn=default_reward_fn(plan, task)))
        value = evaluator()
        prompts, completions, scores = getattr(evaluator, "last_samples", ([], [], []))
        return {"metrics": {evaluator.metric: value}, "model": str(model),
                "eval_samples": r.run.eval_samples, "eval_temperature": r.run.eval_temperature,
                "samples": [{"prompt": p, "completion": c, "score": s}
                            for p, c, s in list(zip(prompts, completions, scores))[:16]]}
