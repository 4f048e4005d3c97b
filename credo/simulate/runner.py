"""Run a scenario's modes and summarise each: step time and its breakdown, idle time, speed-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from credo.simulate.agentic import run_agentic_sync
from credo.simulate.asynchronous import run_async
from credo.simulate.elastic import make_elastic_pool
from credo.simulate.rlvr import run_sync, run_tail_batching
from credo.simulate.scenario import ModeSpec, Scenario
from credo.simulate.sim import SimContext, make_context

RUNNERS = {"sync": run_sync, "tail_batching": run_tail_batching, "async": run_async,
           "agentic_sync": run_agentic_sync, "agentic_async": run_async}


@dataclass
class ModeResult:
    name: str
    """The mode's label."""
    mode: str
    """Its kind (sync, tail_batching, ...)."""
    step_time_s: float
    """Simulated seconds per training step (all steps)."""
    rollout_s: float
    """Mean seconds per step on the critical path rolling out (async: waiting for the batch)."""
    reward_s: float
    """Mean seconds per step scoring a batch (0 where scoring overlaps rollout)."""
    train_s: float
    """Mean seconds per step training."""
    sync_s: float
    """Mean seconds per step syncing weights."""
    idle_s: float
    """Mean seconds per step that one of the job's devices spends doing nothing."""
    occupancy: float
    """Mean share of an engine's batch slots holding a sequence while it decodes (continuous engines)."""
    speedup: float = 1.0
    """Baseline step time over this mode's."""
    stats: dict = field(default_factory=dict)
    """Mode-specific counts: aborted or dropped samples, max staleness, SLO violations, long rounds."""
    records: list = field(default_factory=list)
    """The per-step StepRecords."""
    tokens_per_s: float = 0.0
    """Trained tokens (prompt + response) per simulated second, as credo's perf/tokens_per_s counts them."""


def simulate_mode(scn: Scenario, spec: ModeSpec, seed: int | None = None) -> tuple[ModeResult, SimContext]:
    """Simulate one mode for scn.steps training steps."""
    seed = scn.seed if seed is None else seed
    factory = None
    if spec.serving.devices > 0:
        ctx_len = scn.workload.lengths.prompt_len + scn.workload.lengths.median
        factory = lambda env, s, n: make_elastic_pool(env, s.costs, n, s.max_batch, s.serving, ctx_len, seed)  # noqa: E731
    ctx = make_context(spec, scn.workload, scn.steps, seed, pool_factory=factory)
    proc = ctx.env.process(RUNNERS[spec.mode](ctx))
    ctx.env.run(until=proc)
    return summarise(ctx), ctx


def summarise(ctx: SimContext) -> ModeResult:
    recs, spec = ctx.records, ctx.spec
    n = len(recs)
    total = recs[-1].end - recs[0].start
    own = [d for d in ctx.pool.decoders if not getattr(d, "serving", False)]
    busy = sum(d.busy_s for d in own) + ctx.train_busy_s
    idle = max(0.0, ctx.all_devices * total - busy) / ctx.all_devices / n
    slots = sum(d.max_batch * d.decode_s for d in own if d.max_batch)
    stats = {"aborted": sum(r.aborted for r in recs), "max_staleness": max(r.staleness_max for r in recs),
             "long_rounds": sum(r.kind == "long" for r in recs)}
    serving = [d for d in ctx.pool.decoders if getattr(d, "serving", False)]
    if serving:
        stats["slo_violating_steps"] = sum(d.slo_steps for d in serving)
        stats["serving_shared_steps"] = sum(d.shared_steps for d in serving)
        stats["serving_decode_share"] = (sum(d.tokens for d in serving) /
                                         max(1, sum(d.tokens for d in ctx.pool.decoders)))
    if "long_queue" in ctx.extra:
        stats["queued_prompts"] = len(ctx.extra["long_queue"])
    if spec.partial_rollout:
        samples = max(1, sum(r.samples for r in recs))
        stats["interrupted_frac"] = sum(r.interrupted for r in recs) / samples
        stats["version_span_mean"] = sum(r.version_span_sum for r in recs) / samples
        stats["version_span_max"] = max(r.version_span_max for r in recs)
    return ModeResult(name=spec.name, mode=spec.mode, step_time_s=total / n,
                      rollout_s=sum(r.rollout_s for r in recs) / n, reward_s=sum(r.reward_s for r in recs) / n,
                      train_s=sum(r.train_s for r in recs) / n, sync_s=sum(r.sync_s for r in recs) / n, idle_s=idle,
                      occupancy=sum(d.slot_s for d in own) / slots if slots else float("nan"), stats=stats,
                      records=recs,
                      tokens_per_s=sum(r.tokens + r.prompt_tokens for r in recs) / total if total > 0 else float("nan"))


def simulate(scn: Scenario) -> list[ModeResult]:
    """Every mode of the scenario, with speed-ups against scn.baseline."""
    results = [simulate_mode(scn, spec)[0] for spec in scn.modes]
    base = next(r for r in results if r.name == scn.baseline)
    for r in results:
        r.speedup = base.step_time_s / r.step_time_s if r.step_time_s > 0 else float("nan")  # all costs zero
    return results
