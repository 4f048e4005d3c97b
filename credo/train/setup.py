"""The builder's parts that touch the outside world, each a small public function of the recipe.

    make_run_dir(r, world)                      the run folder (refuses a folder that holds a run, unless resuming)
    prepare_policy(r, task, rank, world)        the base policy's folder: the cached warm-up's output, or the model
    family_warmups(r, active, task, path, key)  an active family's own warm-up after credo's (its part `warmup`)
    check_context(r, base_path, task)           every prompt + rollout.max_new_tokens fits the model's context
    make_backend(plan, engine, tokenizer, path) the rollout engine: hf (the trainer's own module), vLLM, or Ray
                                                rollout workers (cluster.engine: ray), with what the plan needs of
                                                it (prompt embeddings for a source with soft prefixes)
    reward_function(r, task, functions)         the group reward function: the plan's imported reward.functions
                                                or reward.function, or the task's verifier
    fault_nan_steps()                           the test hook CREDO_FAULT_NAN_STEP
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from credo.checkpoint import list_checkpoints
from credo.config import Recipe, sft_enabled
from credo.distributed.rollout import HFBackend
from credo.errors import ConfigError
from credo.models import load_tokenizer, resolve_model_path
from credo.rewards.functions import WeightedRewards, is_trl_style
from credo.rewards.worker import per_sample
from credo.tasks.render import encode_prompts, prompt_renderer


def fault_nan_steps() -> frozenset[int]:
    """Test hook: CREDO_FAULT_NAN_STEP=N (or `2,5` or `3-6`) forces the loss of those steps to NaN."""
    steps: set[int] = set()
    for part in filter(None, os.environ.get("CREDO_FAULT_NAN_STEP", "").replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        steps.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(steps)


def reward_function(r: Recipe, task, functions: tuple = ()):
    """The group reward function: reward.functions (weighted), reward.function, or the task's verifier.
    `functions`: the plan's (key, spec, imported function) of reward.function(s) (`credo.plan.RunPlan`)."""
    if r.reward.functions:
        return WeightedRewards([fn for _, _, fn in functions], r.reward.weights)
    if r.reward.function:
        fn = functions[0][2]
        return WeightedRewards([fn]) if is_trl_style(fn) else fn  # a TRL-style function is called TRL's way
    if getattr(task, "score", None) is None:
        raise ConfigError(f"task '{r.task.name}' has no verifier: expected reward.functions (TRL-style reward "
                          "functions, 'module:function') or reward.function")
    return per_sample(task.score)


def make_run_dir(r: Recipe, world: int) -> Path:
    path = [r.run.output_dir or os.path.join("runs", r.run.name, time.strftime("%Y%m%d-%H%M%S"))]
    if world > 1:
        dist.broadcast_object_list(path, src=0)
    run_dir = Path(path[0])
    previous = [p.name for p in (run_dir / "metrics.jsonl", *list_checkpoints(run_dir / "checkpoints")) if p.exists()]
    if previous and not r.run.resume:  # a fresh run here would append to its metrics and prune its checkpoints
        raise ConfigError(f"config key 'run.output_dir' = '{run_dir}' already holds a run ({', '.join(previous)}); "
                          "expected run.resume=auto to continue it, or a new run.output_dir")
    try:  # a folder that cannot be made is a setting to fix, said in one line
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"config key 'run.output_dir' = '{run_dir}' cannot be written ({why}); "
                          "expected a folder this user can create and write") from None
    return run_dir


def prepare_policy(r: Recipe, task, rank: int, world: int) -> tuple[str, str | None]:
    """The base policy's folder: the SFT warm-up's (cached) output, or the model itself."""
    out: list = [None, None]
    if rank == 0:
        base = resolve_model_path(r.model.path, r.model.tiny)
        if sft_enabled(r) and r.sft.steps > 0:
            from credo.sft import run_sft

            out = list(run_sft(r, base, task, log=lambda m: logging.getLogger("credo").info(m)))
        else:
            out = [base, None]
    if world > 1:
        dist.broadcast_object_list(out, src=0)
    return out[0], out[1]


def family_warmups(r: Recipe, active: tuple, task, policy_path: str, sft_key: str | None, rank: int,
                   world: int) -> tuple[str, str | None]:
    """Each active family's own warm-up (`credo.plan.ActiveFamily`), after credo's: its part `warmup(recipe, task,
    policy_path, log=) -> (policy_path, key)` runs on rank 0 (it caches its output as credo's warm-up does) and every
    rank takes the folder it returns. Its key joins the warm-up key a resume is checked against. No family warm-up:
    nothing changes."""
    for a in active:
        if a.parts.warmup is None:
            continue
        out: list = [None, None]
        if rank == 0:
            out = list(a.parts.warmup(r, task, policy_path, log=lambda m: logging.getLogger("credo").info(m)))
        if world > 1:
            dist.broadcast_object_list(out, src=0)
        name = a.family.name
        if out[1] is not None:
            policy_path, sft_key = out[0], f"{sft_key}+{name}:{out[1]}" if sft_key else f"{name}:{out[1]}"
    return policy_path, sft_key


def check_context(r: Recipe, base_path: str, task) -> None:
    """Every prompt + rollout.max_new_tokens fits the base model's context (the warm-up changes neither the
    tokenizer nor the context, so this runs before it)."""
    from transformers import AutoConfig

    try:
        limit = getattr(AutoConfig.from_pretrained(base_path), "max_position_embeddings", None)
    except (OSError, ValueError):  # not loadable here: loading the model reports it
        return
    if limit is None:
        return
    tokenizer = load_tokenizer(base_path)
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    longest, where = 0, None
    for i, p in enumerate(task.eval_problems()[:1000]):
        n = len(encode_prompts(tokenizer, render, [p])[0])
        if n > longest:
            longest, where = n, f"eval problem {i}"
    for i in range(min(len(task), 2000)):
        n = len(encode_prompts(tokenizer, render, [task.train(i)])[0])
        if n > longest:
            longest, where = n, f"train problem {i}"
    if longest + r.rollout.max_new_tokens > limit:
        raise ConfigError(
            f"prompt too long: {where} has {longest} tokens + rollout.max_new_tokens={r.rollout.max_new_tokens}"
            f" > the model's context of {limit} tokens (max_position_embeddings); shorten prompts or max_new_tokens")


def make_backend(plan, engine, tokenizer, policy_path: str, cluster=None):
    """The rollout engine: Ray rollout workers when `cluster` (cluster.engine: ray), else hf (sampling from the
    trainer's own module) or vLLM in this process, with what the plan (`credo.plan.RunPlan`) needs of it."""
    from credo.capabilities import PROMPT_EMBEDS

    r = plan.recipe
    ro = r.rollout
    embeds = plan.needs_backend(PROMPT_EMBEDS)  # a source with soft prefixes (palette) sends prompt embeddings
    if cluster is not None:
        return cluster.rollout_backend(r, engine, policy_path, prompt_embeds=embeds)
    if ro.backend == "hf":
        return HFBackend(engine.module, tokenizer, max_batch=ro.hf_max_batch, dtype=ro.dtype, fp8_weights=ro.fp8_weights)
    from credo.distributed.vllm_backend import VLLMBackend

    eager = ro.vllm_enforce_eager
    common = dict(dtype=ro.dtype or r.model.dtype, seed=r.run.seed, kv_cache_gib=ro.vllm_kv_cache_gib,
                  gpu_memory_utilization=ro.vllm_gpu_memory_utilization,
                  enforce_eager=(not torch.cuda.is_available()) if eager is None else eager, fp8_weights=ro.fp8_weights)
    if ro.vllm_engine == "async":  # the plan refused what it does not provide (prompt embeddings, the race)
        from credo.distributed.vllm_async import AsyncVLLMBackend

        backend = AsyncVLLMBackend(policy_path, **common)
    else:
        backend = VLLMBackend(policy_path, **common,
                              input_embeddings=engine.module.get_input_embeddings() if embeds else None)
    if ro.fp8_weights:  # the engine loaded full-precision weights from disk: quantise them before step 1
        backend.sync_weights(engine.module, 0)
    return backend
