"""Recipe -> stages: the only code besides `credo.config` that reads a `Recipe`.

`build(recipe)` checks what the recipe names (`credo.preflight`), sets up the process group, checks that
every prompt fits the model's context, then makes the run folder, the warm-up policy, the DeepSpeed
engine and the rollout engine, and binds every stage once from the recipe:

    source     a RolloutSource      (stages.rollout: default = the task's single-turn prompts)
    reward     a RewardModel        (stages.reward: default = reward.functions, reward.function or the verifier)
    advantage  an AdvantageStage    (stages.advantage: default = the outcome estimator algo.advantage;
                                     with critic.num_critics >= 1, the critic stage: GAE, PPO / AsyPPO)
    scorer     a PolicyScorer       (temperature, chunking, ZeRO-3 path, reference model, stages.probes)
    objective  an Objective         (policy loss + KL + entropy, algo.*)
    updater    an Updater           (epochs, mini/micro-batches, non-finite skip)
    state      a TrainState         (engine, RNG, counters, the stages' own states)

Registries (`credo.algos`, `credo.train.registry`) are read here and in config validation, nowhere else.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from credo import algos
from credo.checkpoint import list_checkpoints
from credo.config import ConfigError, Recipe, recipe_to_dict, recipe_to_yaml, sft_enabled
from credo.distributed.engine import build_engine, device, setup_distributed
from credo.distributed.rollout import HFBackend
from credo.models import check_vocab, load_causal_lm, load_tokenizer, resolve_model_path
from credo.rewards.chat import encode_prompts, prompt_renderer
from credo.rewards.functions import WeightedRewards, is_trl_style
from credo.preflight import preflight
from credo.rewards.tasks import make_task
from credo.rewards.worker import RewardWorker, import_reward_fn, per_sample
from credo.train.advantage import OutcomeAdvantage
from credo.train.evaluate import Evaluator
from credo.train.objective import Objective
from credo.train.registry import StageContext, resolve
from credo.train.reward import FunctionReward
from credo.train.rollout import PromptRollout
from credo.train.scoring import PolicyScorer
from credo.train.state import TrainState
from credo.train.update import Updater, grad_accum_steps


@dataclass
class Components:
    """Everything a `Trainer` runs, built once."""

    rank: int
    world: int
    run_dir: Path
    tokenizer: Any
    task: Any
    engine: Any
    source: Any
    reward: Any
    advantage: Any
    scorer: PolicyScorer
    objective: Objective
    updater: Updater
    state: TrainState
    evaluate: Evaluator | None
    gate: Any  # credo.train.mipu.StepGate: MIPU step 2, the random-rollback control, or off
    # run bookkeeping the loop needs
    steps: int
    eval_every: int
    save_every: int
    keep_last: int
    overlong_filter: bool
    dump_every: int
    resume: str | None
    allow_config_change: bool
    config: dict
    config_yaml: str
    tracker_args: dict
    zero_stage: int = 0


def fault_nan_steps() -> frozenset[int]:
    """Test hook: CREDO_FAULT_NAN_STEP=N (or `2,5` or `3-6`) forces the loss of those steps to NaN."""
    steps: set[int] = set()
    for part in filter(None, os.environ.get("CREDO_FAULT_NAN_STEP", "").replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        steps.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(steps)


def build(r: Recipe) -> Components:
    notes = preflight(r)  # seconds, before the process group, the warm-up or any model load
    if int(os.environ.get("RANK", 0)) == 0:
        for note in notes:
            logging.getLogger("credo").info(note)
    rank, world = setup_distributed(verbose=r.run.verbose)
    torch.set_num_threads(r.run.threads or max(1, (os.cpu_count() or 1) // world))
    if r.rollout.prompts_per_step % world:
        raise ConfigError(f"config key 'rollout.prompts_per_step' = {r.rollout.prompts_per_step} must be divisible "
                          f"by the number of processes ({world})")
    torch.manual_seed(r.run.seed)
    if r.env.id:  # a multi-turn run: the task is the env's expert episodes (warm-up demonstrations)
        task = _env_task(r)
    else:
        task = make_task(r.task)
        _check_context(r, resolve_model_path(r.model.path, r.model.tiny), task)  # before the warm-up, not after it
    run_dir = _run_dir(r, world)  # made once the recipe is known to start
    policy_path, sft_key = _prepare_policy(r, task, rank, world)
    tokenizer = load_tokenizer(policy_path)
    model = load_causal_lm(policy_path, r.model.dtype)
    check_vocab(model, tokenizer, policy_path)
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    ref = None
    if r.model.ref_model:
        ref = load_causal_lm(policy_path, r.model.dtype).to(device()).eval().requires_grad_(False)
    ro, a, o = r.rollout, r.algo, r.optim
    grad_accum = grad_accum_steps(ro.prompts_per_step // world * ro.group_size, a.mini_batches, a.micro_batch_size)
    engine = build_engine(model, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                          zero_stage=o.zero_stage, warmup_steps=o.warmup_steps, micro_batch=a.micro_batch_size,
                          grad_accum=grad_accum, bf16=r.model.dtype == "bfloat16", lr_schedule=o.lr_schedule,
                          total_steps=r.run.steps * a.ppo_epochs * a.mini_batches, min_lr_ratio=o.min_lr_ratio)
    backend = _make_backend(r, engine, tokenizer, policy_path)
    sampling = dict(prompts_per_step=ro.prompts_per_step, group_size=ro.group_size, max_new_tokens=ro.max_new_tokens,
                    temperature=ro.temperature, top_p=ro.top_p)
    ctx = StageContext(rank=rank, world=world, seed=r.run.seed, tokenizer=tokenizer, task=task, backend=backend,
                       engine=engine, rollout=sampling, render=render, env=r.env, judge=r.judge, task_config=r.task,
                       reward_isolation=dict(timeout_s=r.reward.timeout_s, workers=r.reward.workers,
                                             max_failure_frac=r.reward.max_failure_frac))

    holdout = r.mipu.val_prompts if r.mipu.enabled else 0
    ctx.default = PromptRollout(task, tokenizer, backend, seed=r.run.seed, rank=rank, world=world, render=render,
                                holdout=holdout, **sampling)
    source = _stage(ctx, "rollout", r.stages.rollout, r.stages.rollout_kwargs)
    fn = None if r.env.id else _reward_fn(r, task)  # a multi-turn run's reward is the env's (stages.reward: env)
    ctx.default = None if fn is None else FunctionReward(
        RewardWorker(fn, timeout_s=r.reward.timeout_s, workers=r.reward.workers,
                     max_failure_frac=r.reward.max_failure_frac), tokenizer, ro.group_size)
    reward = _stage(ctx, "reward", r.stages.reward, r.stages.reward_kwargs)
    if not r.critic.num_critics:
        ctx.default = OutcomeAdvantage(algos.ADVANTAGE_ESTIMATORS[a.advantage], a.advantage_kwargs)
        advantage = _stage(ctx, "advantage", r.stages.advantage, r.stages.advantage_kwargs)
    ctx.default = None
    probes = [_stage(ctx, "probe", spec, r.stages.probe_kwargs.get(spec, {})) for spec in r.stages.probes]

    scorer = PolicyScorer(temperature=ro.temperature, chunk_size=a.logprob_chunk_size, hidden_path=o.zero_stage < 3,
                          needs_old_log_probs=a.ppo_epochs * a.mini_batches > 1, ref_model=ref, probes=probes)
    if r.critic.num_critics:  # the critic stage is the advantage stage (config validation refuses stages.advantage)
        advantage = _critic_stage(r, tokenizer, policy_path, engine, scorer, ref, world)
    objective = Objective(algos.POLICY_LOSSES[a.policy_loss], a.loss_kwargs, agg_mode=a.agg_mode,
                          entropy_coef=a.entropy_coef, kl_coef=a.kl_coef,
                          kl_estimator=algos.KL_ESTIMATORS[a.kl_estimator] if ref is not None else None,
                          norm_len=ro.max_new_tokens)
    updater = Updater(engine, scorer, objective, ppo_epochs=a.ppo_epochs, mini_batches=a.mini_batches,
                      grad_accum=grad_accum, zero_stage=o.zero_stage, world=world, fault_nan_steps=fault_nan_steps())
    config = recipe_to_dict(r)
    components = {name: stage for name, stage in (("source", source), ("advantage", advantage))
                  if hasattr(stage, "state_dict")}
    state = TrainState(engine, components, config=config, sft_key=sft_key, policy_path=policy_path,
                       max_consecutive_skips=r.run.max_consecutive_skips)
    gate = _step_gate(r, state, source, backend, reward, scorer, engine, tokenizer, render, task, rank, world)
    eval_reward = fn if isinstance(fn, WeightedRewards) else WeightedRewards([fn])  # scores tasks without a verifier
    evaluate = None if r.env.id else Evaluator(task, tokenizer, source, seed=r.run.seed, temperature=r.run.eval_temperature,
                         samples=r.run.eval_samples, rank=rank, world=world, render=render,
                         reward_fn=eval_reward) if r.run.eval_every else None
    if r.env.id and r.run.eval_every:  # held-out episodes of the env, played by the multi-turn source
        from credo.train.multiturn import EnvEvaluator

        evaluate = EnvEvaluator(source, r.env.eval_episodes, temperature=r.run.eval_temperature, seed=r.run.seed)
    wandb_cfg = {"project": r.run.wandb_project, "mode": r.run.wandb_mode} if r.run.wandb else None
    return Components(
        rank=rank, world=world, run_dir=run_dir, tokenizer=tokenizer, task=task, engine=engine, source=source,
        reward=reward, advantage=advantage, scorer=scorer, objective=objective, updater=updater, state=state,
        evaluate=evaluate, gate=gate, steps=r.run.steps, eval_every=r.run.eval_every, save_every=r.run.save_every,
        keep_last=r.run.keep_last, overlong_filter=a.overlong_filter, dump_every=r.run.dump_rollouts_every,
        resume=r.run.resume, allow_config_change=r.run.allow_config_change, config=config,
        config_yaml=recipe_to_yaml(r), zero_stage=o.zero_stage,
        tracker_args=dict(total_steps=r.run.steps, progress=r.run.progress, plot=r.run.plot, wandb_cfg=wandb_cfg))


def _step_gate(r: Recipe, state: TrainState, source, backend, reward, scorer, engine, tokenizer, render, task,
               rank: int, world: int):
    """MIPU step 2 (mipu.enabled), the random-rollback control (mipu.random_rollback) or an idle gate; an active
    gate's rollback window is part of the trainer state (checkpointed, and put back by a restore)."""
    from credo.train.mipu import StepGate

    m, ro = r.mipu, r.rollout
    mode = "mipu" if m.enabled else ("random" if m.random_rollback > 0 else None)
    n = len(task)
    gate = StepGate(mode=mode, state=state, source=source, backend=backend, reward=reward, scorer=scorer,
                    engine=engine, tokenizer=tokenizer, render=render,
                    val_problems=[task.train(i) for i in range(n - m.val_prompts, n)] if m.enabled else [],
                    val_group_size=m.val_group_size, c_start=m.c_start, c_end=m.c_end, anneal_steps=m.anneal_steps,
                    rollback_prob=m.random_rollback, seed=r.run.seed, rank=rank, world=world,
                    sampling=dict(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p))
    if mode is not None:
        state.components["mipu"] = gate
    return gate


def _reward_fn(r: Recipe, task):
    """The group reward function: reward.functions (weighted), reward.function, or the task's verifier."""
    if r.reward.functions:
        return WeightedRewards.from_specs(r.reward.functions, r.reward.weights)
    if r.reward.function:
        fn = import_reward_fn(r.reward.function)
        return WeightedRewards([fn]) if is_trl_style(fn) else fn  # a TRL-style function is called TRL's way
    if getattr(task, "score", None) is None:
        raise ConfigError(f"task '{r.task.name}' has no verifier: expected reward.functions (TRL-style reward "
                          "functions, 'module:function') or reward.function")
    return per_sample(task.score)


def _critic_stage(r: Recipe, tokenizer, policy_path: str, engine, scorer: PolicyScorer, ref, world: int):
    """M value models (each on its own DeepSpeed engine) behind a `CriticAdvantage` stage."""
    from credo.distributed.value_model import load_value_model
    from credo.train.critic import CriticAdvantage, PolicyKL

    c, ro = r.critic, r.rollout
    path = policy_path if c.path is None else resolve_model_path(c.path, c.tiny)
    # the smallest shard a critic gets on one rank sets its micro-batches per optimizer step
    smallest_shard = ro.prompts_per_step // world * (ro.group_size // c.num_critics)
    grad_accum = grad_accum_steps(smallest_shard, c.mini_batches, c.micro_batch_size)
    engines = [build_engine(load_value_model(path, dtype=r.model.dtype, head_seed=r.run.seed * 1000 + m,
                                             actor_tokenizer=tokenizer, actor_path=policy_path),
                            lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, grad_clip=c.grad_clip,
                            zero_stage=r.optim.zero_stage, warmup_steps=c.warmup_steps,
                            micro_batch=c.micro_batch_size, grad_accum=grad_accum, bf16=r.model.dtype == "bfloat16")
               for m in range(c.num_critics)]
    return CriticAdvantage(
        engines, gae_kwargs=r.algo.advantage_kwargs, value_agg=c.value_agg, whiten=c.whiten,
        kl_in_reward=c.kl_in_reward, kl=PolicyKL(scorer, engine, ref) if c.kl_in_reward else None,
        low_frac=c.low_frac, high_frac=c.high_frac, value_clip=c.value_clip, epochs=c.epochs,
        mini_batches=c.mini_batches, micro_batch_size=c.micro_batch_size, grad_accum=grad_accum,
        critic_only_steps=c.critic_only_steps, zero_stage=r.optim.zero_stage, world=world)


def _stage(ctx: StageContext, kind: str, spec: str, kwargs: dict):
    factory = resolve(kind, spec, f"stages.{kind}")
    return ctx.default if factory is None else factory(ctx, **kwargs)


def _run_dir(r: Recipe, world: int) -> Path:
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


def _prepare_policy(r: Recipe, task, rank: int, world: int) -> tuple[str, str | None]:
    """The base policy's folder: the SFT warm-up's (cached) output, or the model itself."""
    import logging

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


def _env_task(r: Recipe):
    """The env's expert episodes as a task; env.max_total_tokens must fit the base model's context."""
    from transformers import AutoConfig

    from credo.envs.task import EnvTask
    from credo.train.multiturn import turn_format

    base = resolve_model_path(r.model.path, r.model.tiny)
    try:
        limit = getattr(AutoConfig.from_pretrained(base), "max_position_embeddings", None)
    except (OSError, ValueError):
        limit = None
    if limit is not None and r.env.max_total_tokens > limit:
        raise ConfigError(f"config key 'env.max_total_tokens' = {r.env.max_total_tokens} is more than the model's "
                          f"context of {limit} tokens (max_position_embeddings)")
    try:
        tokenizer = load_tokenizer(base)
    except (OSError, ValueError):  # not loadable here: loading the model reports it
        return EnvTask(r.env, None, None, None)
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    return EnvTask(r.env, tokenizer, *turn_format(tokenizer, render, r.env.observation_template))


def _check_context(r: Recipe, base_path: str, task) -> None:
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


def _make_backend(r: Recipe, engine, tokenizer, policy_path: str):
    ro = r.rollout
    if ro.backend == "hf":
        return HFBackend(engine.module, tokenizer, max_batch=ro.hf_max_batch, dtype=ro.dtype, fp8_weights=ro.fp8_weights)
    from credo.distributed.vllm_backend import VLLMBackend

    eager = ro.vllm_enforce_eager
    backend = VLLMBackend(policy_path, dtype=ro.dtype or r.model.dtype, seed=r.run.seed,
                          kv_cache_gib=ro.vllm_kv_cache_gib, gpu_memory_utilization=ro.vllm_gpu_memory_utilization,
                          enforce_eager=(not torch.cuda.is_available()) if eager is None else eager,
                          fp8_weights=ro.fp8_weights)
    if ro.fp8_weights:  # the engine loaded full-precision weights from disk: quantise them before step 1
        backend.sync_weights(engine.module, 0)
    return backend
