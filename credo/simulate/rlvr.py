"""Single-turn modes with a batch barrier: synchronous (verl-like) and tail batching (RollPacker).

- `sync`: each step generates P0 x R0 responses, waits for the longest, scores, trains and syncs.
- `tail_batching` (arXiv 2509.21009, spec 13): a short round launches ceil(eta_P * P0) prompts with R' > R0
  responses each; a prompt is complete once R0 of its responses have finished (its others are aborted); the round
  ends when P0 prompts are complete, and every other prompt is aborted into the long-prompt queue. When the queue
  holds >= P0 prompts the step is a long round instead: P0 queued prompts, exactly R0 responses each, to full
  length. A queued prompt's responses are drawn again from the same prompt (a long prompt stays long). Every step
  trains exactly P0 x R0 samples, all from the current weights.
"""

from __future__ import annotations

import math

from credo.simulate.engine import Request
from credo.simulate.lengths import draw_responses
from credo.simulate.sim import SimContext, StepRecord, new_prompt, train_phase


def _requests(ctx: SimContext, pid: int, ident, n: int, quantum: int = 1) -> list[Request]:
    """n requests of a prompt; with `quantum` > 1 each holds its slot to the next multiple of `quantum` steps."""
    w = ctx.workload
    held = lambda n_tok: min(w.lengths.max_len, -(-n_tok // quantum) * quantum)  # noqa: E731
    return [Request(ctx.env, w.lengths.prompt_len, held(n_tok), tag=pid, trained_length=n_tok)
            for n_tok in draw_responses(w.lengths, ident, n, ctx.rng)]


def run_sync(ctx: SimContext):
    """The synchronous baseline (a SimPy process)."""
    env, w = ctx.env, ctx.workload
    for step in range(1, ctx.steps + 1):
        rec = StepRecord(step=step, start=env.now, end=0.0)
        if w.lengths.kind == "replay":  # a measured run's step, sample for sample
            pairs = w.lengths.replay[(step - 1) % len(w.lengths.replay)]
            reqs = [Request(env, p, n, tag=i) for i, (p, n) in enumerate(pairs)]
            prompts, width = [], max(p + n for p, n in pairs)
        else:
            prompts = [new_prompt(ctx) for _ in range(w.prompts_per_step)]
            reqs = [r for pid, ident in prompts for r in _requests(ctx, pid, ident, w.group_size)]
            width = None
        ctx.pool.submit_batch(reqs)
        yield env.all_of([r.done for r in reqs])
        rec.rollout_s = env.now - rec.start
        rec.prompt_ids = [pid for pid, _ in prompts]
        prompt_len = max(r.prompt_len for r in reqs)
        yield from train_phase(ctx, rec, [r.length for r in reqs], prompt_len, pad_width=width)
        rec.end = env.now
        ctx.records.append(rec)


def _short_round(ctx: SimContext, queue: list, rec: StepRecord):
    """Launch, race to P0 complete prompts, abort the rest into `queue`; returns the kept requests."""
    env, w, spec = ctx.env, ctx.workload, ctx.spec
    p0, r0 = w.prompts_per_step, w.group_size
    prompts = [new_prompt(ctx) for _ in range(math.ceil(spec.prompt_ratio * p0))]
    by_prompt = {pid: _requests(ctx, pid, ident, spec.max_responses, spec.finish_quantum) for pid, ident in prompts}
    done_count = {pid: 0 for pid in by_prompt}
    complete: list[int] = []
    round_over = env.event()

    def on_finish(ev):
        req = ev.value
        pid = req.tag
        if round_over.triggered or done_count[pid] >= r0:
            return
        done_count[pid] += 1
        if done_count[pid] == r0:
            complete.append(pid)
            for other in by_prompt[pid]:  # the prompt has its R0: stop its speculative extras
                if other.finish_time is None:
                    other.device.abort(other) if other.device else _abort_queued(other)
            if len(complete) == p0:
                round_over.succeed()

    reqs = [r for pid, _ in prompts for r in by_prompt[pid]]
    for r in reqs:
        r.done.callbacks.append(on_finish)
    ctx.pool.submit_batch(reqs)
    yield round_over
    kept = []
    for pid in complete:  # each complete prompt keeps its first R0 finishers
        kept += sorted((r for r in by_prompt[pid] if r.finish_time is not None), key=lambda r: r.finish_time)[:r0]
    idents = dict(prompts)
    for pid in by_prompt:
        if pid not in complete:
            queue.append((pid, idents[pid]))
    for r in reqs:
        if r.finish_time is None and not r.aborted:
            rec.aborted += 1
            r.device.abort(r) if r.device else _abort_queued(r)
        elif r.aborted:
            rec.aborted += 1
    rec.prompt_ids = list(complete)
    return kept


def _abort_queued(req: Request) -> None:
    req.aborted = True  # still in a queue: skipped when a device would admit it


def run_tail_batching(ctx: SimContext):
    """Tail batching (a SimPy process); ctx.extra['long_queue'] holds the queued prompts at the end."""
    env, w = ctx.env, ctx.workload
    queue: list = []
    ctx.extra["long_queue"] = queue
    for step in range(1, ctx.steps + 1):
        rec = StepRecord(step=step, start=env.now, end=0.0)
        if len(queue) >= w.prompts_per_step:
            rec.kind = "long"
            taken = [queue.pop(0) for _ in range(w.prompts_per_step)]
            kept = [r for pid, ident in taken for r in _requests(ctx, pid, ident, w.group_size)]
            ctx.extra.get("long_pool", ctx.pool).submit_batch(kept)
            yield env.all_of([r.done for r in kept])
            rec.prompt_ids = [pid for pid, _ in taken]
        else:
            rec.kind = "short"
            kept = yield from _short_round(ctx, queue, rec)
        rec.rollout_s = env.now - rec.start
        rec.queue = len(queue)
        yield from train_phase(ctx, rec, [r.trained_length for r in kept], w.lengths.prompt_len)
        rec.end = env.now
        ctx.records.append(rec)
