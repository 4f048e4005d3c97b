"""Asynchronous modes with a staleness bound (ROLL Flash, arXiv 2510.11345; RollArc).

Rollout and training run on separate devices at once. A producer keeps issuing prompt groups while at most
S + 1 training batches' worth are issued and not yet consumed (ROLL's async_generation_ratio = S); responses go
to one shared queue that every engine pulls from (queue scheduling, per-sample dispatch). The trainer takes the
first P0 complete groups (no batch barrier: short groups train first) and drops a group whose oldest response
started more than S policy versions before the weights being trained (staleness = trained version - start
version). After each step the new weights are pushed to every engine (a pause of sync_s on each).

With `partial_rollout` the push interrupts every sequence in flight: it keeps its tokens, is prefilled again under
the new weights (prompt + response so far) and goes on; its oldest token's version is the sample's (so its
staleness counts from there), and the step records how many trained samples were interrupted and their version
spans (newest minus oldest token version). With `engine: static` the rollout device is credo's overlap worker
(`stages.schedule: overlap` on the hf backend): requests of max_batch rows are generate calls, and the worker takes
new weights between calls, or after the token in progress with partial rollout (credo.simulate.engine).

`agentic_async` runs multi-turn episodes at the trajectory level (RollArc's fine-grained asynchrony, ROLL Flash's
environment-level asynchrony): each episode alternates a decode request and an environment step, so an
episode waiting on its environment holds no engine slot and no other episode waits for it.
"""

from __future__ import annotations

from credo.simulate.agentic import draw_turns, run_episode
from credo.simulate.costs import reward_time
from credo.simulate.engine import Request
from credo.simulate.lengths import draw_responses
from credo.simulate.sim import SimContext, StepRecord, new_prompt, train_phase


def _single_turn_group(ctx: SimContext, pid: int, ident):
    """One prompt's R0 responses through the shared queue, then their scores (per-sample reward).
    Returns (response lengths, oldest token's version, [(interrupted, version span)] per response)."""
    env, w = ctx.env, ctx.workload
    reqs = [Request(env, w.lengths.prompt_len, n, tag=pid) for n in draw_responses(w.lengths, ident, w.group_size, ctx.rng)]
    for r in reqs:
        ctx.pool.submit(r)
    yield env.all_of([r.done for r in reqs])
    yield env.timeout(reward_time(ctx.spec.costs, len(reqs)))
    lengths = [r.length for r in reqs]
    return lengths, min(r.version for r in reqs), [(r.interrupts > 0, r.last_version - r.version) for r in reqs]


def _agentic_group(ctx: SimContext, pid: int, ident):
    """One prompt's R0 episodes, each at its own pace; returns (trained lengths, oldest start version)."""
    env, w = ctx.env, ctx.workload
    procs = [env.process(run_episode(ctx, pid, ident, draw_turns(w.agent, ctx.rng))) for _ in range(w.group_size)]
    results = yield env.all_of(procs)
    eps = [results[p] for p in procs]
    return [e[0] for e in eps], min(e[1] for e in eps), []


def run_async(ctx: SimContext):
    """The staleness-bounded asynchronous trainer (a SimPy process); `agentic_async` when the mode says so."""
    env, w, spec = ctx.env, ctx.workload, ctx.spec
    p0, bound = w.prompts_per_step, spec.staleness
    state = {"version": 0, "issued": 0}  # issued: groups issued and not dropped (consumed ones included)
    ready: list = []
    signals = {"ready": env.event(), "version": env.event()}
    group = _agentic_group if spec.mode == "agentic_async" else _single_turn_group

    def one_group(pid, ident):
        lengths, version, partial = yield from group(ctx, pid, ident)
        ready.append((pid, lengths, version, partial))
        if not signals["ready"].triggered:
            signals["ready"].succeed()

    def producer():
        while True:
            if state["issued"] < (state["version"] + 1 + bound) * p0:
                state["issued"] += 1
                env.process(one_group(*new_prompt(ctx)))
            else:
                signals["version"] = env.event()
                yield signals["version"]

    env.process(producer())
    for step in range(1, ctx.steps + 1):
        rec = StepRecord(step=step, start=env.now, end=0.0)
        batch = []
        while len(batch) < p0:
            while not ready:
                signals["ready"] = env.event()
                yield signals["ready"]
            pid, lengths, version, partial = ready.pop(0)
            if (step - 1) - version > bound:  # too stale: dropped, its slot in the window is issued again
                rec.aborted += len(lengths)
                state["issued"] -= 1
                _wake(signals["version"])
                continue
            batch.append((pid, lengths, version))
            if spec.partial_rollout:
                rec.interrupted += sum(hit for hit, _ in partial)
                rec.version_span_sum += sum(span for _, span in partial)
                rec.version_span_max = max([rec.version_span_max] + [span for _, span in partial])
        rec.rollout_s = env.now - rec.start
        rec.prompt_ids = [b[0] for b in batch]
        rec.staleness_max = max((step - 1) - b[2] for b in batch)
        lengths = [n for b in batch for n in b[1]]
        yield from train_phase(ctx, rec, lengths, w.lengths.prompt_len, score=False)
        state["version"] = step
        _wake(signals["version"])
        rec.end = env.now
        ctx.records.append(rec)


def _wake(ev) -> None:
    if not ev.triggered:
        ev.succeed()
