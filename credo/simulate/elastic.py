"""Elastic rollout on shared serving devices (ROSE, "Rollout On Serving GPUs via Cooperative Elasticity").

Serving devices already run a serving model under bursty traffic and a latency SLO. Rollout sequences may share
them: a serving device's decode step then carries both batches,

    step = decode_step_s + decode_seq_s * (b_serving + b_rollout) + decode_ctx_s * (ctx_serving + ctx_rollout)

and the SLO (seconds per output token, i.e. one decode step) must hold. Serving traffic alternates a base load
and bursts (exponential durations). The guard decides how many rollout sequences a serving device admits:

- `reserve` (SLO-safe; inferred, the abstract does not say how ROSE's executor sizes its share): admit only as many
  as fit under the SLO with a full burst in flight, so a burst never pushes a step over the SLO;
- `none`: fill to the SLO at the current load; when a burst arrives the step in progress runs over the SLO, then
  the excess is evicted (preempted: it re-queues and recomputes its context on another device).

Rollout requests go through one shared queue (every dedicated and serving device pulls from it), so ROSE's
elastic routing is the queue dispatch with capacity that moves with serving load: a request goes to a dedicated
device while one has a free slot, to a serving device (the opportunistic capacity) otherwise. With `migrate` (inferred: the
abstract says the scheduler "dynamically routes rollouts across dedicated and opportunistic serving GPUs"), a
dedicated device with free slots and an empty queue takes back the longest-running rollout sequences from the
serving devices (they recompute their context there), so the long tail does not finish at a serving device's
slower step. Same-model serving is assumed
(ROSE co-locates heterogeneous models; their memory split is not modelled). Weight transfer to serving devices
costs sync_s like any engine.
"""

from __future__ import annotations

import math
import random
from collections import deque

from credo.simulate.costs import Costs
from credo.simulate.engine import Decoder, Pool
from credo.simulate.scenario import ServingSpec


class ServingDecoder(Decoder):
    """A serving device lending spare decode capacity to rollout."""

    serving = True

    def __init__(self, env, costs: Costs, spec: ServingSpec, name: str, queue: deque, rollout_ctx: float):
        self.spec = spec
        self.serving_batch = spec.base_batch
        self.rollout_ctx = rollout_ctx  # a rollout sequence's typical context, for sizing the admission
        self.slo_steps = 0      # decode steps that ran over the SLO
        self.shared_steps = 0   # decode steps that carried rollout sequences
        self._chunk_serving = spec.base_batch
        self._late = False
        self.migrating: dict = {}  # sequence -> the dedicated device that asked for it (moves at a step boundary)
        super().__init__(env, costs, spec.max_batch, name, queue=queue)

    def _guard_load(self) -> int:
        """The serving batch the guard plans for: a full burst (reserve) or the load now (none)."""
        return self.spec.burst_batch if self.spec.guard == "reserve" else self.serving_batch

    def _step_with(self, b_serving: int, b_roll: int, ctx_roll: float) -> float:
        c = self.costs
        return (c.decode_step_s + c.decode_seq_s * (b_serving + b_roll)
                + c.decode_ctx_s * (b_serving * self.spec.serving_ctx + ctx_roll))

    def capacity(self) -> int:
        """Rollout sequences that fit under the SLO with the planned serving load: those active (at their real
        contexts, one step ahead) plus new ones at a typical rollout context."""
        s, c = self.spec, self.costs
        b_s = self._guard_load()
        ctx = sum(r.prompt_len + r.generated + 1 for r in self.active)
        slack = s.slo_tpot_s - self._step_with(b_s, len(self.active), ctx)
        per_seq = c.decode_seq_s + c.decode_ctx_s * self.rollout_ctx
        extra = math.floor(slack / per_seq) if per_seq > 0 else s.max_batch
        if slack < 0:  # over already: shed sequences until the step fits
            n, ctxs = len(self.active), sorted((r.prompt_len + r.generated + 1 for r in self.active), reverse=True)
            while n > 0 and self._step_with(b_s, n, ctx) > s.slo_tpot_s:
                ctx -= ctxs[len(self.active) - n]
                n -= 1
            return max(0, min(s.max_batch - b_s, n))
        return max(0, min(s.max_batch - b_s, len(self.active) + extra))

    def max_chunk_steps(self, b: int, ctx: float) -> int:
        """Steps until the growing contexts would push a step over the SLO under the planned serving load (one
        step when a burst has just landed on an unguarded device)."""
        if self._late:
            return 1
        grow = self.costs.decode_ctx_s * b
        slack = self.spec.slo_tpot_s - self._step_with(self._guard_load(), b, ctx)
        return max(1, math.floor(slack / grow) + 1) if grow > 0 else 1 << 60

    def step_load(self, b: int, ctx: float) -> tuple[int, float]:
        self._chunk_serving = self.serving_batch  # serving requests join and leave at step boundaries
        return b + self.serving_batch, ctx + self.serving_batch * self.spec.serving_ctx

    def after_chunk(self, b: int, ctx: float, steps: int, dt: float) -> None:
        """Count the chunk's decode steps that ran over the SLO (each step's time at the chunk's serving load)."""
        if steps <= 0:
            return
        self.shared_steps += steps
        first = self._step_with(self._chunk_serving, b, ctx)
        grow = self.costs.decode_ctx_s * b
        over = self.spec.slo_tpot_s + 1e-12 - first
        if over < 0:
            self.slo_steps += steps
        elif grow > 0:
            self.slo_steps += max(0, steps - (math.floor(over / grow) + 1))
        self.rollout_ctx = 0.5 * self.rollout_ctx + 0.5 * ((ctx + b * steps) / b)  # the typical context new ones get

    def evict_excess(self) -> None:
        if self._late:  # unguarded: the preemption lands one step after the burst (that step runs over the SLO)
            self._late = False
            return
        while self.inbox and len(self.active) + len(self.inbox) > self.capacity():  # not started: back to the queue
            self.queue.appendleft(self.inbox.pop())
            self.pool.poke_all()
        moving = [(r, self.migrating[r]) for r in self.active if r in self.migrating]
        self.migrating.clear()
        while len(self.active) > self.capacity() or moving:
            r, target = moving.pop() if moving else (self.active[-1], None)
            self.active.remove(r)
            r.device, r.prefill_tokens = None, r.prompt_len + r.generated  # its KV is gone: recompute on re-admission
            if target is not None:
                target.inbox.append(r)
                target.poke()
            else:
                self.queue.appendleft(r)
                self.pool.poke_all()


class ElasticPool(Pool):
    """Dedicated and serving devices on one queue; a dedicated device with spare slots pulls the longest-running
    sequences back from the serving devices (`migrate`)."""

    def __init__(self, decoders, migrate: bool):
        super().__init__(decoders, "queue")
        self.migrate = migrate

    def submit(self, req) -> None:
        """Dedicated devices first (the one with the largest free share); serving devices take the overflow
        (opportunistic capacity); the shared queue when all are full."""
        for group in ([d for d in self.decoders if not getattr(d, "serving", False)],
                      [d for d in self.decoders if getattr(d, "serving", False)]):
            best, best_free = None, 0.0
            for d in group:
                cap = d.capacity()
                free = (cap - len(d.active) - len(d.inbox)) / cap if cap > 0 else 0.0
                if free > best_free:
                    best, best_free = d, free
            if best is not None:
                best.inbox.append(req)
                best.poke()
                return
        self.queue.append(req)
        self.poke_all()

    def spare(self, dec) -> None:
        if not self.migrate or getattr(dec, "serving", False):
            return
        free = dec.capacity() - len(dec.active)
        pending = sum(len(d.migrating) for d in self.decoders if getattr(d, "serving", False))
        cands = sorted(((r, d) for d in self.decoders if getattr(d, "serving", False) for r in d.active
                        if r not in d.migrating and not r.aborted), key=lambda x: -x[0].generated)
        for r, d in cands[:max(0, free - pending)]:
            d.migrating[r] = dec
            d.poke(force=True)


def serving_traffic(env, dev: ServingDecoder, rng: random.Random):
    """Alternate base load and bursts on one serving device (a SimPy process)."""
    s = dev.spec
    while True:
        dev.serving_batch = s.base_batch
        dev.poke(force=True)
        yield env.timeout(rng.expovariate(1.0 / s.base_mean_s))
        dev.serving_batch = s.burst_batch
        dev._late = s.guard == "none" and bool(dev.active)
        dev.poke(force=True)
        yield env.timeout(rng.expovariate(1.0 / s.burst_mean_s))


def make_elastic_pool(env, costs: Costs, dedicated: int, max_batch: int, spec: ServingSpec, rollout_ctx: float,
                      seed: int) -> Pool:
    """Dedicated rollout devices and serving devices on one shared queue; serving traffic started."""
    if spec.burst_batch >= spec.max_batch or spec.base_batch > spec.burst_batch:
        raise ValueError(f"serving: expected base_batch ({spec.base_batch}) <= burst_batch ({spec.burst_batch}) "
                         f"< max_batch ({spec.max_batch})")
    alone = costs.decode_step_s + (costs.decode_seq_s + costs.decode_ctx_s * spec.serving_ctx) * spec.burst_batch
    if alone > spec.slo_tpot_s:
        raise ValueError(f"serving.slo_tpot_s = {spec.slo_tpot_s}: a burst alone already takes {alone:.4f} s per "
                         "step; the serving cluster cannot meet its SLO even without rollout")
    shared: deque = deque()
    decoders = [Decoder(env, costs, max_batch, f"rollout{i}", queue=shared) for i in range(dedicated)]
    rng = random.Random(seed + 1)
    for i in range(spec.devices):
        dev = ServingDecoder(env, costs, spec, f"serving{i}", shared, rollout_ctx)
        decoders.append(dev)
        env.process(serving_traffic(env, dev, rng))
    return ElasticPool(decoders, spec.migrate)
