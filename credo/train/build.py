"""Recipe -> stages: the code that binds a `Recipe` to the stages of a run, through the family table.

`build(plan)` takes the run plan (`credo.plan.RunPlan`, from `credo.preflight.preflight(recipe)`: every name the
recipe uses resolved once, every capability and refusal checked), sets up the process group, makes the task
(an active family's, e.g. a multi-turn env's expert episodes, or the recipe's task after a context check),
the run folder, the warm-up policy (credo's, then an active family's own), the DeepSpeed engine and the rollout
engine (`credo.train.setup`), then binds every stage once:

    source     a RolloutSource      (stages.rollout: default = the task's single-turn prompts), scheduled by
                                    stages.schedule (credo/schedules/: sync, tail_batching, fixed_lag, overlap)
    reward     a RewardModel        (stages.reward: default = reward.functions, reward.function or the verifier)
    probes     Probes               (stages.probes)
    scorer     a PolicyScorer       (temperature, chunking, ZeRO-3 path, reference model, the probes)
    advantage  an AdvantageStage    (stages.advantage: default = the outcome estimator algo.advantage)
    objective  an Objective         (policy loss + KL + entropy, algo.*)
    updater    an Updater           (epochs, mini/micro-batches, non-finite skip)
    state      a TrainState         (engine, RNG, counters, every stateful stage and hook)
    hooks      StepHooks            (the active families': MIPU's accept-or-roll-back)
    evaluate   an evaluator         (an active family's, or the task's held-out split)

A stage named 'default' is the built-in, or the stage an active family puts in its place (the critic stage for
advantages). This module names no family and resolves no name: it reads the plan.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from credo import algos
from credo.config import Recipe, recipe_to_dict, recipe_to_yaml
from credo.distributed.engine import device, setup_distributed
from credo.distributed.engines import make_engine
from credo.errors import ConfigError
from credo.lora import BaseReference, add_lora
from credo.models import check_vocab, load_causal_lm, load_tokenizer, resolve_model_path
from credo.plan import RunPlan
from credo.preflight import preflight
from credo.rewards.functions import WeightedRewards
from credo.rewards.worker import RewardWorker
from credo.tasks import make_task
from credo.tasks.render import prompt_renderer
from credo.train.advantage import OutcomeAdvantage
from credo.train.cluster import open_cluster
from credo.train.evaluate import Evaluator
from credo.train.objective import Objective
from credo.train.registry import StageContext, build_stage
from credo.train.reward import FunctionReward
from credo.train.rollout import PromptRollout
from credo.train.scoring import PolicyScorer
from credo.train.setup import (check_context, fault_nan_steps, family_warmups, make_backend, make_run_dir,
                               prepare_policy, reward_function)
from credo.train.staleness import staleness_lr_factor
from credo.train.state import RESUME_FIXED_KEYS, TrainState
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
    evaluate: Any
    hooks: list
    """Step hooks (`credo.train.hooks`) the trainer calls around each step."""
    cluster: Any
    """The run's Ray parts (`credo.train.cluster.Cluster`) with cluster.engine: ray; None with the local engine."""
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


def build(plan: RunPlan | Recipe) -> Components:
    """The run's components from its plan (a recipe is planned first: `credo.preflight.preflight`)."""
    if not isinstance(plan, RunPlan):
        plan = preflight(plan)  # seconds, before the process group, the warm-up or any model load
    r = plan.recipe
    if int(os.environ.get("RANK", 0)) == 0:
        log = logging.getLogger("credo")
        for note in plan.notes:  # 'warning: ...' notes (an asynchronous loss that ignores the behaviour policy) warn
            if note.startswith("warning: "):
                log.warning(note[len("warning: "):])
            else:
                log.info(note)
    rank, world = setup_distributed(verbose=r.run.verbose, backend=r.engine.backend)
    torch.set_num_threads(r.run.threads or max(1, (os.cpu_count() or 1) // world))
    if r.rollout.prompts_per_step % world:
        raise ConfigError(f"config key 'rollout.prompts_per_step' = {r.rollout.prompts_per_step} must be divisible "
                          f"by the number of processes ({world})")
    torch.manual_seed(r.run.seed)
    task = run_task(plan)
    check_reward_inputs(plan, task)
    run_dir = make_run_dir(r, world)  # made once the recipe is known to start
    policy_path, sft_key = prepare_policy(r, task, rank, world)
    policy_path, sft_key = family_warmups(r, plan.active, task, policy_path, sft_key, rank, world)
    tokenizer = load_tokenizer(policy_path)
    model = load_causal_lm(policy_path, r.model.dtype)
    check_vocab(model, tokenizer, policy_path)
    # with model.lora, `model` keeps being the module to train, now holding the adapter (its only trainable weights)
    peft_model = add_lora(model, r.model.lora, seed=r.run.seed) if r.model.lora.r else None
    if r.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    ref = None
    if r.model.ref_model:  # with LoRA: the policy with its adapter off, no second copy
        ref = BaseReference(peft_model) if peft_model is not None else \
            load_causal_lm(policy_path, r.model.dtype).to(device()).eval().requires_grad_(False)
    ro, a, o = r.rollout, r.algo, r.optim
    grad_accum = grad_accum_steps(ro.prompts_per_step // world * ro.group_size, a.mini_batches, a.micro_batch_size)
    lr = o.lr * (staleness_lr_factor(plan.staleness, o.staleness_ref) if o.staleness_lr_scaling else 1.0)
    engine = make_engine(r.engine.backend, model, lr=lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                         zero_stage=o.zero_stage, warmup_steps=o.warmup_steps, micro_batch=a.micro_batch_size,
                         grad_accum=grad_accum, bf16=r.model.dtype == "bfloat16", lr_schedule=o.lr_schedule,
                         total_steps=r.run.steps * a.ppo_epochs * a.mini_batches, min_lr_ratio=o.min_lr_ratio,
                         cpu_offload=r.engine.cpu_offload, reshard_after_forward=r.engine.reshard_after_forward)
    cluster = open_cluster(r)  # None with the local engine
    try:
        return _bind(plan, rank, world, run_dir, policy_path, sft_key, tokenizer, task, engine, render, ref,
                     grad_accum, cluster)
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise


def _bind(plan: RunPlan, rank, world, run_dir, policy_path, sft_key, tokenizer, task, engine, render, ref,
          grad_accum, cluster) -> Components:
    """The stages, the trainer state, the hooks and the evaluator, bound once the engines exist."""
    r = plan.recipe
    a, o = r.algo, r.optim
    ctx = StageContext(rank=rank, world=world, recipe=r, tokenizer=tokenizer, task=task, engine=engine, render=render,
                       backend=make_backend(plan, engine, tokenizer, policy_path, cluster), policy_path=policy_path,
                       ref_model=ref, cluster=cluster)
    parts, ctx = build_stages(plan, ctx, grad_accum)
    config = recipe_to_dict(r)
    stateful = {name: stage for name, stage in (("source", parts.source), ("advantage", parts.advantage),
                                                ("reward", parts.reward),
                                                *((f"probe:{k}", v) for k, v in parts.probes.items()))
                if hasattr(stage, "state_dict")}
    parts.state = TrainState(engine, stateful, config=config, sft_key=sft_key, policy_path=policy_path,
                             max_consecutive_skips=r.run.max_consecutive_skips,
                             defaults=recipe_to_dict(type(r)()),
                             fixed_keys=RESUME_FIXED_KEYS + tuple(k for f in plan.families for k in f.fixed_on_resume))
    hooks = step_hooks(plan, ctx, parts) + ([cluster.hook] if cluster is not None else [])
    for hook in hooks:  # a hook with state joins the trainer state (checkpoints, resume, rollback)
        if hasattr(hook, "state_dict"):
            parts.state.components[hook.name] = hook
    wandb_cfg = {"project": r.run.wandb_project, "mode": r.run.wandb_mode} if r.run.wandb else None
    return Components(
        rank=rank, world=world, run_dir=run_dir, tokenizer=tokenizer, task=task, engine=engine, source=parts.source,
        reward=parts.reward, advantage=parts.advantage, scorer=parts.scorer, objective=parts.objective,
        updater=parts.updater, state=parts.state, evaluate=make_evaluator(plan, ctx, parts),
        hooks=hooks, cluster=cluster,
        steps=r.run.steps, eval_every=r.run.eval_every, save_every=r.run.save_every,
        keep_last=r.run.keep_last, overlong_filter=a.overlong_filter, dump_every=r.run.dump_rollouts_every,
        resume=r.run.resume, allow_config_change=r.run.allow_config_change, config=config,
        config_yaml=recipe_to_yaml(r), zero_stage=o.zero_stage,
        tracker_args=dict(total_steps=r.run.steps, progress=r.run.progress, plot=r.run.plot, wandb_cfg=wandb_cfg,
                          tensorboard_dir=run_dir / "tensorboard" if r.run.tensorboard else None))


def check_run(r: Recipe) -> RunPlan:
    """`credo check`: every check `build` makes before the warm-up (names, capabilities, targets, the task and its
    prompts against the model's context, the reward functions' inputs), without building a model or a run folder.
    Returns the plan (its `notes`)."""
    plan = preflight(r)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if r.rollout.prompts_per_step % world:
        raise ConfigError(f"config key 'rollout.prompts_per_step' = {r.rollout.prompts_per_step} must be divisible "
                          f"by the number of processes ({world})")
    check_reward_inputs(plan, run_task(plan))
    return plan


def check_reward_inputs(plan: RunPlan, task) -> None:
    """The default reward stage has something to score with, and the reward functions' columns exist."""
    from credo.rewards.functions import check_columns, is_trl_style

    r = plan.recipe
    if plan.stages["reward"].resolved is None:
        default_reward_fn(plan, task)  # a task without a verifier needs reward functions
    keys = [key for key, _, _ in plan.reward_functions]
    fns = [fn for _, _, fn in plan.reward_functions]
    if any(is_trl_style(f) for f in fns) and plan.task_owner is None:
        sample = [task.train(i) for i in range(min(len(task), 8))] + list(task.eval_problems()[:8])
        check_columns(fns, keys, sample, f"task '{r.task.name}'")


def run_task(plan: RunPlan):
    """The run's task: an active family's (a multi-turn env's expert episodes), or the recipe's task, whose prompts
    must fit the model's context (checked before the warm-up, not after it)."""
    r = plan.recipe
    if plan.task_owner is not None:
        return plan.task_owner.parts.task(r)
    task = make_task(r.task, plan.families)
    check_context(r, resolve_model_path(r.model.path, r.model.tiny), task)
    return task


def build_stages(plan: RunPlan, ctx: StageContext, grad_accum: int) -> tuple[SimpleNamespace, StageContext]:
    """The source, reward, probes, scorer, advantage stage, objective and updater, in the order each needs the last.
    Returns them and the runtime context with the source and the scorer in it (for the hooks and the evaluator)."""
    r = plan.recipe
    ro, a, o = r.rollout, r.algo, r.optim
    out = SimpleNamespace()
    out.source = scheduled(plan, ctx, build_source(plan, ctx))
    ctx = replace(ctx, source=out.source)
    out.reward_fn = default_reward_fn(plan, ctx.task)
    reward = None if out.reward_fn is None else FunctionReward(
        (ctx.cluster is not None and ctx.cluster.reward_worker(r, out.reward_fn))
        or RewardWorker(out.reward_fn, timeout_s=r.reward.timeout_s, workers=r.reward.workers,
                        max_failure_frac=r.reward.max_failure_frac), ctx.tokenizer, ro.group_size)
    out.reward = _stage(ctx, plan.stages["reward"], reward)
    out.probes = {p.name: _stage(ctx, p) for p in plan.probes}
    out.scorer = PolicyScorer(
        temperature=ro.temperature, chunk_size=a.logprob_chunk_size, hidden_path=o.zero_stage < 3,
        needs_old_log_probs=a.ppo_epochs * a.mini_batches > 1 or plan.staleness > 0, ref_model=ctx.ref_model,
        probes=list(out.probes.values()), packed=a.packing, micro_batch_tokens=a.micro_batch_tokens,
        old_log_probs=a.old_log_probs, router_replay=a.router_replay)
    ctx = replace(ctx, scorer=out.scorer)
    outcome = OutcomeAdvantage(algos.ADVANTAGE_ESTIMATORS[a.advantage], a.advantage_kwargs) \
        if algos.ADVANTAGE_INPUTS.get(a.advantage) == "outcome" else None
    out.advantage = _stage(ctx, plan.stages["advantage"], outcome)
    out.objective = Objective(algos.POLICY_LOSSES[a.policy_loss], a.loss_kwargs, agg_mode=a.agg_mode,
                              entropy_coef=a.entropy_coef, kl_coef=a.kl_coef,
                              kl_estimator=algos.KL_ESTIMATORS[a.kl_estimator] if ctx.ref_model is not None else None,
                              norm_len=ro.max_new_tokens)
    out.updater = Updater(ctx.engine, out.scorer, out.objective, ppo_epochs=a.ppo_epochs, mini_batches=a.mini_batches,
                          grad_accum=grad_accum, zero_stage=o.zero_stage, world=ctx.world,
                          fault_nan_steps=fault_nan_steps(),
                          train_mode=r.model.gradient_checkpointing or r.model.lora.dropout > 0,
                          micro_batch_tokens=a.micro_batch_tokens, packed=a.packing, old_log_probs=a.old_log_probs)
    return out, ctx


def build_source(plan: RunPlan, ctx: StageContext):
    """The rollout source (stages.rollout, default: the task's prompts); unscheduled."""
    r = plan.recipe
    holdout = sum(a.family.holdout(r) for a in plan.active)  # problems an active family keeps out (MIPU's validation)
    default = PromptRollout(ctx.task, ctx.tokenizer, ctx.backend, seed=r.run.seed, rank=ctx.rank, world=ctx.world,
                            render=ctx.render, holdout=holdout, routing=captures_routing(plan, ctx), **ctx.rollout)
    return _stage(ctx, plan.stages["rollout"], default)


def captures_routing(plan: RunPlan, ctx: StageContext) -> bool:
    """Whether the rollout records each token's MoE experts: an MoE policy on an engine that can (the hf backend,
    `credo.capabilities.ROUTING_CAPTURE`), for replay (algo.router_replay) and moe/routing_disagreement.

    Raises:
        ConfigError: algo.router_replay is on and the policy has no MoE router.
    """
    from credo.capabilities import ROUTING_CAPTURE
    from credo.moe import ROUTER_CLASSES, routers

    if ctx.engine is None:  # `credo eval`: no training engine, no update to replay into; it only samples
        return False
    moe = bool(routers(ctx.engine.module))
    if plan.recipe.algo.router_replay and not moe:
        raise ConfigError(f"config key 'algo.router_replay' = true but the policy at '{ctx.policy_path}' has no MoE "
                          f"router ({', '.join(ROUTER_CLASSES)}): expected a mixture-of-experts model, e.g. "
                          "model.tiny.arch: qwen3_moe (docs/moe.md)")
    return moe and ROUTING_CAPTURE in plan.provided["backend"]


def scheduled(plan: RunPlan, ctx: StageContext, source):
    """The rollout source as the plan's schedule runs it (credo/schedules/: sync returns it as it is)."""
    return plan.schedule.spec.wrap(source, ctx, plan.schedule.settings)


def _stage(ctx: StageContext, stage, default=None):
    """The stage the plan resolved (`credo.plan.StagePlan`); `default`, the built-in of its kind, when it resolved to
    none. The factory gets the frozen context with this call's `default` and its family's `section` in it."""
    if stage.resolved is None:
        return default
    return build_stage(stage.resolved, replace(ctx, default=default, section=stage.section), stage.settings)


def default_reward_fn(plan: RunPlan, task):
    """The default reward stage's function; None when the task has no verifier and the recipe names no reward
    function (then a reward stage must be named: asking for the default is the error `reward_function` raises)."""
    r = plan.recipe
    if plan.reward_functions or getattr(task, "score", None) is not None:
        return reward_function(r, task, plan.reward_functions)
    if plan.stages["reward"].resolved is None:  # the built-in stage (not one an active family made the default)
        reward_function(r, task, ())  # raises: the task has no verifier
    return None


def step_hooks(plan: RunPlan, ctx: StageContext, parts: SimpleNamespace) -> list:
    """The active families' step hooks, each built with its family's section in `ctx.section`."""
    hooks = []
    for a in plan.active:
        if a.parts.hooks is not None:
            hooks += a.parts.hooks(replace(ctx, section=a.section), parts)
    return hooks


def make_evaluator(plan: RunPlan, ctx: StageContext, parts: SimpleNamespace):
    """An active family's held-out evaluation, or the task's eval split (scored by the verifier, or by the
    recipe's reward functions when the task has none); None when run.eval_every is 0."""
    r = plan.recipe
    if not r.run.eval_every:
        return None
    owner = plan.evaluator_owner
    if owner is not None:
        return owner.parts.evaluator(replace(ctx, section=owner.section), parts.source, r.run.eval_temperature)
    fn = parts.reward_fn
    eval_reward = fn if isinstance(fn, WeightedRewards) else WeightedRewards([fn])  # scores tasks without a verifier
    return Evaluator(ctx.task, ctx.tokenizer, parts.source, seed=r.run.seed, temperature=r.run.eval_temperature,
                     samples=r.run.eval_samples, rank=ctx.rank, world=ctx.world, render=ctx.render,
                     reward_fn=eval_reward)
