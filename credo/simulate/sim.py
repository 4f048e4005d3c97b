"""What every mode shares: the simulation context, the training phase and the per-step record.

A mode is a SimPy process over a `SimContext`; it appends one `StepRecord` per training step. Device time is
accounted so that idle time can be reported: rollout devices keep their own busy time (credo.simulate.engine),
the training side adds train and sync time times the devices that spend it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import simpy

from credo.simulate.costs import reward_time, train_time
from credo.simulate.engine import Pool, make_pool
from credo.simulate.scenario import ModeSpec, Workload


@dataclass
class StepRecord:
    step: int
    """Training step (1-based)."""
    start: float
    """Simulated seconds when the step's rollout (sync) or its wait for data (async) began."""
    end: float
    """Simulated seconds when the step's weight sync ended."""
    rollout_s: float = 0.0
    """Seconds on the critical path spent rolling out (sync) or waiting for the batch (async)."""
    reward_s: float = 0.0
    """Seconds scoring the batch."""
    train_s: float = 0.0
    """Seconds of the training step (with the recompute of pi_old, logprob_s)."""
    logprob_s: float = 0.0
    """Seconds of it recomputing pi_old (old_log_probs: recompute with costs.logprob_token_s > 0)."""
    sync_s: float = 0.0
    """Seconds of the weight sync."""
    samples: int = 0
    """Samples trained."""
    tokens: int = 0
    """Response tokens trained."""
    max_len: int = 0
    """Longest trained response."""
    kind: str = ""
    """Round type: 'short' or 'long' (tail batching), '' otherwise."""
    aborted: int = 0
    """Responses aborted (tail batching) or samples dropped for staleness (async)."""
    queue: int = 0
    """Prompts in the long-prompt queue after the step (tail batching)."""
    staleness_max: int = 0
    """Largest policy lag of a trained sample (async)."""
    prompt_ids: list = field(default_factory=list)
    """The prompts trained in this step (bookkeeping for the conservation check)."""
    prompt_tokens: int = 0
    """Prompt tokens of the trained samples (prompt_len each)."""
    interrupted: int = 0
    """Trained samples that a weight update interrupted in flight at least once (partial rollout)."""
    version_span_sum: int = 0
    """Sum over trained samples of newest minus oldest token version (partial rollout)."""
    version_span_max: int = 0
    """Largest version span of a trained sample (partial rollout)."""


@dataclass
class SimContext:
    env: simpy.Environment
    rng: random.Random
    spec: ModeSpec
    workload: Workload
    steps: int
    pool: Pool
    train_devices: int
    all_devices: int
    records: list = field(default_factory=list)
    train_busy_s: float = 0.0
    """Device-seconds the training side spent training or syncing (idle accounting)."""
    next_prompt: int = 0
    extra: dict = field(default_factory=dict)


def make_context(spec: ModeSpec, workload: Workload, steps: int, seed: int, *, pool_factory=None) -> SimContext:
    """A fresh SimPy environment with the mode's rollout pool and train devices."""
    env = simpy.Environment()
    if spec.placement == "colocated":
        n_roll, n_train, n_all = spec.devices, spec.devices, spec.devices
    else:
        n_roll, n_train = spec.rollout_devices, spec.train_devices
        n_all = n_roll + n_train
    if pool_factory is not None:  # borrowed devices (ROSE's serving GPUs) are not the job's own: n_all stays
        pool = pool_factory(env, spec, n_roll)
    else:
        pool = make_pool(env, spec.costs, n_roll, spec.max_batch, static=spec.engine == "static", dispatch=spec.dispatch)
        for d in pool.decoders:
            d.partial = spec.partial_rollout
            d.deferred = spec.engine == "static" and spec.mode == "async"
    ctx = SimContext(env=env, rng=random.Random(seed), spec=spec, workload=workload, steps=steps, pool=pool,
                     train_devices=n_train, all_devices=n_all)
    if spec.long_engine and spec.long_engine != spec.engine and pool_factory is None:
        static = spec.long_engine == "static"  # the same devices, driven another way in long rounds
        ctx.extra["long_pool"] = make_pool(env, spec.costs, n_roll, 0 if static else spec.max_batch, static=static,
                                           dispatch=spec.dispatch)
    return ctx


def trained_tokens(workload: Workload, prompt_len: int, lengths: list[int], pad_width: int | None = None) -> int:
    """Tokens the update processes: rows x longest row when padded (credo today), the true sum when packed."""
    if not lengths:
        return 0
    if workload.train_padding == "padded":
        return len(lengths) * (pad_width or prompt_len + max(lengths))
    return sum(prompt_len + n for n in lengths)


def train_phase(ctx: SimContext, rec: StepRecord, lengths: list[int], prompt_len: int, *, score: bool = True,
                pad_width: int | None = None):
    """Reward (unless scored per sample already), train, then sync the weights; fills rec's times.
    Use with `yield from`."""
    env, c = ctx.env, ctx.spec.costs
    if score:
        t = reward_time(c, len(lengths))
        yield env.timeout(t)
        rec.reward_s = t
    tokens = trained_tokens(ctx.workload, prompt_len, lengths, pad_width)
    t = train_time(c, tokens, ctx.train_devices) + c.step_overhead_s
    if ctx.spec.old_log_probs == "recompute" and c.logprob_token_s > 0:  # the trainer's forward for pi_old
        rec.logprob_s = c.logprob_token_s * tokens / max(1, ctx.train_devices)
        t += rec.logprob_s
    yield env.timeout(t)
    rec.train_s = t
    ctx.train_busy_s += t * ctx.train_devices
    t0 = env.now
    partial = ctx.spec.partial_rollout
    if ctx.spec.engine == "static" and ctx.spec.mode == "async":
        # credo's overlap worker: the trainer writes the weights into a shared buffer (sync_s) and goes on; the
        # worker loads them before its next call or, with partial rollout, after its current token
        if c.sync_s > 0:
            yield env.timeout(c.sync_s)
            ctx.train_busy_s += c.sync_s * ctx.train_devices
    elif c.sync_s > 0 or partial:
        version = rec.step if partial else None  # partial rollout: the sync interrupts the sequences in flight
        if ctx.spec.placement == "colocated":  # the devices reload the weights they just trained: busy as sync
            yield from ctx.pool.pause_all(c.sync_s, version)
        else:  # the trainer broadcasts, every engine loads: both sides are busy
            ctx.train_busy_s += c.sync_s * ctx.train_devices
            yield from ctx.pool.pause_all(c.sync_s, version)
    ctx.pool.set_version(rec.step)
    rec.sync_s = env.now - t0
    rec.samples, rec.tokens = len(lengths), sum(lengths)
    rec.prompt_tokens = prompt_len * len(lengths)
    rec.max_len = max(lengths) if lengths else 0


def new_prompt(ctx: SimContext):
    """A fresh prompt: (id, its length identity for later draws)."""
    from credo.simulate.lengths import draw_prompt

    pid = ctx.next_prompt
    ctx.next_prompt += 1
    return pid, draw_prompt(ctx.workload.lengths, ctx.rng, pid)
