"""Rollout devices as SimPy processes: continuous batching (vLLM-like), static batching (transformers
`generate`), and a pool that dispatches requests to them.

A `Decoder` decodes its active requests in lock step. Between events it jumps straight to the next finish
(the chunk's time is a closed form, `costs.chunk_time`); a submit, an abort or a weight sync interrupts the chunk,
which then stops at the end of the step in progress, as an engine admits and aborts only between steps. A static
decoder (`static=True`) runs `generate` calls: a call's batch keeps every row to the end of its longest response
(finished rows still cost a slot, as padding does in transformers), and all its requests finish when the call
does.

Requests dispatched `static` go to fixed devices in contiguous even shares (verl's split of a batch over data-
parallel engines); `queue` dispatch puts them on one shared queue every device pulls from when it has room
(ROLL Flash's queue scheduling, per-sample dispatch).

Partial rollout (`Decoder.partial`, the async mode's `partial_rollout`): a weight sync that carries a version stops
the sequences in flight at the step boundary; after the load they are prefilled again, prompt + response so far
(no KV cache survives new weights), and go on under the new version (`Request.version` stays the oldest token's,
`last_version` is the newest's, `interrupts` counts the updates). A `deferred` static device is credo's overlap worker
(`stages.schedule: overlap`, the hf backend): each call runs under the newest weights taken before it, the trainer
does not wait for it, and with partial rollout a newly published version stops the call after the token in progress;
its unfinished rows go on in a new call (re-prefilled, left-padded) under the new weights.
"""

from __future__ import annotations

from collections import deque

import simpy

from credo.simulate.costs import Costs, chunk_time, prefill_time, steps_done


class Request:
    """One sequence to decode: `length` tokens after a `prompt_len`-token prompt. `done` succeeds with the request
    when its last token is decoded; an aborted request's `done` never fires."""

    __slots__ = ("prompt_len", "length", "generated", "done", "aborted", "version", "tag", "device",
                 "submit_time", "start_time", "finish_time", "prefill_tokens", "trained_length", "last_version",
                 "interrupts")

    def __init__(self, env: simpy.Environment, prompt_len: int, length: int, tag=None, prefill_tokens=None,
                 trained_length=None):
        self.prompt_len, self.length, self.tag = prompt_len, length, tag
        # the response's own length; `length` may be longer: the steps it holds a slot (an engine that sees a
        # finish only between chunks of steps, `ModeSpec.finish_quantum`)
        self.trained_length = length if trained_length is None else trained_length
        # tokens to prefill on admission: the whole prompt, only the new ones of a multi-turn context whose
        # earlier turns sit in the engine's prefix cache, or (after a preemption) the whole context again
        self.prefill_tokens = prompt_len if prefill_tokens is None else prefill_tokens
        self.generated, self.aborted = 0, False
        self.version = None  # the version of its oldest token (partial rollout: it may have newer ones)
        self.last_version = None  # the version of its newest token
        self.interrupts = 0  # weight updates that interrupted it in flight (partial rollout)
        self.device = None
        self.done = env.event()
        self.submit_time, self.start_time, self.finish_time = env.now, None, None


class Decoder:
    """One rollout device (an inference engine instance) with at most `max_batch` sequences in flight."""

    def __init__(self, env: simpy.Environment, costs: Costs, max_batch: int, name: str, *, static: bool = False,
                 queue: deque | None = None):
        self.env, self.costs, self.max_batch, self.name, self.static = env, costs, max_batch, name, static
        self.queue = queue if queue is not None else deque()  # shared with other devices under queue dispatch
        self.active: list[Request] = []
        self.version = 0
        self.partial = False  # partial rollout: a weight update interrupts the sequences in flight (module docstring)
        self.deferred = False  # static engine of an async mode: new weights are taken between calls (credo's worker)
        self.loaded = 0  # the version of the weights this device holds (deferred devices)
        self._reread: list[Request] = []  # interrupted sequences to prefill again under the new weights
        self.pool = None
        self.busy_s = self.decode_s = self.prefill_s = self.sync_s = self.slot_s = 0.0
        self.tokens = 0
        self._pauses: deque = deque()
        self.inbox: deque = deque()  # requests routed to this device alone (migrated back from a serving device)
        self._wake = env.event()
        self._interruptible = self._pending = False
        self.proc = env.process(self._run_static() if static else self._run())

    # -- hooks the serving decoder (credo.simulate.elastic) overrides --------------------------------------------
    def capacity(self) -> int:
        """Rollout sequences this device may hold now."""
        return self.max_batch

    def step_load(self, b: int, ctx: float) -> tuple[int, float]:
        """The batch and context one decode step really runs (a serving device adds its own traffic)."""
        return b, ctx

    def max_chunk_steps(self, b: int, ctx: float) -> int:
        """Most decode steps before the device must stop and re-check (the serving decoder's SLO horizon)."""
        return 1 << 60

    def after_chunk(self, b: int, ctx: float, steps: int, dt: float) -> None:
        """Called after every decode chunk (the serving decoder checks its latency SLO here)."""

    # -- the interface ---------------------------------------------------------------------------------------------
    def load(self) -> int:
        return len(self.active) + (len(self.queue) if self.pool is None else 0)

    def submit(self, req: Request) -> None:
        self.queue.append(req)
        self.poke()

    def abort(self, req: Request) -> None:
        """Stop a request at the next step boundary (or drop it from the queue); its slot frees then."""
        if req.finish_time is None and not req.aborted:
            req.aborted = True
            if req.device is self:
                self.poke()

    def pause(self, seconds: float, version: int | None = None) -> simpy.Event:
        """Occupy the device for `seconds` (a weight sync) at the next step boundary; the event fires after it.
        With `version` on a partial-rollout device, the new weights are that version's and every sequence in flight
        is interrupted: it keeps its tokens and is prefilled again (prompt + response so far) before it goes on."""
        ev = self.env.event()
        self._pauses.append((seconds, ev, version))
        self.poke(force=True)
        return ev

    def poke(self, force: bool = False) -> None:
        """Wake an idle device, or interrupt a running chunk when there is something to do at a step boundary."""
        if not self._wake.triggered:
            self._wake.succeed()
        elif self._interruptible and not self._pending:
            room = len(self.active) < self.capacity()
            if force or any(r.aborted for r in self.active) or ((self.queue or self.inbox) and room):
                self._pending = True
                self.proc.interrupt()

    # -- the processes ---------------------------------------------------------------------------------------------
    def _admit(self) -> list[Request]:
        new = []
        while (self.inbox or self.queue) and len(self.active) < self.capacity():
            req = (self.inbox or self.queue).popleft()
            if req.aborted:
                continue
            req.device, req.version = self, self.version
            req.last_version = self.version
            if req.start_time is None:
                req.start_time = self.env.now
            self.active.append(req)
            new.append(req)
        return new

    def _account(self, kind: str, dt: float) -> None:
        self.busy_s += dt
        setattr(self, kind, getattr(self, kind) + dt)

    def _run(self):
        env, c = self.env, self.costs
        while True:
            if self._pauses:
                seconds, ev, version = self._pauses.popleft()
                yield env.timeout(seconds)
                self._account("sync_s", seconds)
                if version is not None and self.partial:
                    self.version = version
                    self._interrupt(self.active, version)
                    self._reread += self.active
                ev.succeed()
                continue
            self.active = [r for r in self.active if not r.aborted]
            self.evict_excess()
            new = self._admit()
            reread, self._reread = [r for r in self._reread if not r.aborted and r in self.active], []
            if new or reread:  # prefill what was not prefilled yet (a preempted request recomputes its whole context;
                # an interrupted one, partial rollout, its prompt and response so far under the new weights)
                tokens = sum(r.prefill_tokens for r in new) + sum(r.prompt_len + r.generated for r in reread)
                t = prefill_time(c, tokens)
                yield env.timeout(t)
                self._account("prefill_s", t)
                continue
            if self.pool is not None and not self.queue and not self.inbox and len(self.active) < self.capacity():
                self.pool.spare(self)  # free slots and nothing queued: the pool may route work here
            if not self.active:
                self._wake = env.event()
                yield self._wake
                continue
            yield from self._decode_chunk()

    def _decode_chunk(self):
        env, c = self.env, self.costs
        b, ctx = len(self.active), float(sum(r.prompt_len + r.generated for r in self.active))
        k = max(1, min(min(r.length - r.generated for r in self.active), self.max_chunk_steps(b, ctx)))
        rb, rctx = self.step_load(b, ctx)
        start, steps = env.now, k
        self._interruptible = True
        try:
            yield env.timeout(chunk_time(c, rb, rctx, k))
        except simpy.Interrupt:
            self._interruptible = False
            elapsed = env.now - start
            steps = steps_done(c, rb, rctx, elapsed, k)
            if steps < k:  # finish the step in progress
                yield env.timeout(max(0.0, chunk_time(c, rb, rctx, steps + 1) - elapsed))
                steps += 1
        self._interruptible = self._pending = False
        dt = env.now - start
        self._account("decode_s", dt)
        self.slot_s += b * dt
        self.tokens += b * steps
        self.after_chunk(b, ctx, steps, dt)
        for r in self.active:
            r.generated += steps
        finished = [r for r in self.active if r.generated >= r.length]
        self.active = [r for r in self.active if r.generated < r.length]
        for r in finished:
            r.finish_time = env.now
            r.done.succeed(r)

    def evict_excess(self) -> None:
        """Give back requests beyond capacity() (the serving decoder's SLO guard); none on a dedicated device."""

    def _interrupt(self, reqs: list[Request], version: int) -> None:
        """Partial rollout: new weights of `version` arrive while `reqs` are in flight; their next tokens are the new
        version's. A request without a token yet has no old token: its oldest is the new version's."""
        for r in reqs:
            r.interrupts += 1
            r.last_version = version
            if r.generated == 0:
                r.version = version

    def _run_static(self):
        env, c = self.env, self.costs
        while True:
            while self._pauses:
                seconds, ev, _ = self._pauses.popleft()
                yield env.timeout(seconds)
                self._account("sync_s", seconds)
                ev.succeed()
            call = []
            while self.queue and (len(call) < self.max_batch or self.max_batch == 0):
                req = self.queue.popleft()
                if not req.aborted:
                    call.append(req)
            if not call:
                self._wake = env.event()
                yield self._wake
                continue
            if self.deferred:
                yield from self._worker_call(call)
            else:
                yield from self._static_call(call)

    def _static_call(self, call: list[Request]):
        """One `generate` call: a left-padded batch decoded until its longest response ends."""
        env, c = self.env, self.costs
        n, width = len(call), max(r.prompt_len for r in call)
        k = max(r.length for r in call)
        for r in call:
            r.device, r.version, r.start_time = self, self.version, env.now
        t_pre = prefill_time(c, n * width)
        t_dec = chunk_time(c, n, n * width, k)
        yield env.timeout(t_pre + t_dec)
        self._account("prefill_s", t_pre)
        self._account("decode_s", t_dec)
        self.slot_s += n * t_dec
        self.tokens += sum(r.length for r in call)
        for r in call:
            r.generated, r.finish_time = r.length, env.now
            r.done.succeed(r)


    def _take_weights(self):
        """A deferred device loads the newest published weights (sync_s) if it does not hold them yet."""
        if self.loaded != self.version:
            yield self.env.timeout(self.costs.sync_s)
            self._account("sync_s", self.costs.sync_s)
            self.loaded = self.version

    def _worker_call(self, call: list[Request]):
        """One request on credo's overlap worker (`stages.schedule: overlap`, the hf backend): a `generate` call of
        its rows under the newest weights, taken first. Without partial rollout the call runs to its longest row
        under the version it started with. With it (credo.distributed.partial), newly published weights stop the
        call after the token in progress; the worker loads them and the unfinished rows go on in a new call, their
        prompt and response so far prefilled again (left-padded to the longest), under the new version; the
        request returns when its last row ends."""
        env, c = self.env, self.costs
        yield from self._take_weights()
        for r in call:
            r.device, r.version, r.last_version, r.start_time = self, self.loaded, self.loaded, env.now
        rows = list(call)
        while rows:
            n, width = len(rows), max(r.prompt_len + r.generated for r in rows)
            t_pre = prefill_time(c, n * width)
            yield env.timeout(t_pre)
            self._account("prefill_s", t_pre)
            k = max(r.length - r.generated for r in rows)
            if self.partial and self.version != self.loaded:  # published during the prefill: stop after a token
                k = 1
            start, steps = env.now, k
            self._interruptible = self.partial
            try:
                yield env.timeout(chunk_time(c, n, n * width, k))
            except simpy.Interrupt:
                self._interruptible = False
                elapsed = env.now - start
                steps = steps_done(c, n, n * width, elapsed, k)
                if steps < k:  # finish the step in progress
                    yield env.timeout(max(0.0, chunk_time(c, n, n * width, steps + 1) - elapsed))
                    steps += 1
            self._interruptible = self._pending = False
            dt = env.now - start
            self._account("decode_s", dt)
            self.slot_s += n * dt
            for r in rows:
                self.tokens += min(steps, r.length - r.generated)
                r.generated = min(r.length, r.generated + steps)
            rows = [r for r in rows if r.generated < r.length]
            if rows:  # interrupted by new weights (partial rollout): load them, the unfinished rows go on
                yield from self._take_weights()
                self._interrupt(rows, self.loaded)
        for r in call:
            r.finish_time = env.now
            r.done.succeed(r)


class Pool:
    """The rollout devices and how requests reach them: `static` (even contiguous shares) or `queue` (shared)."""

    def __init__(self, decoders: list[Decoder], dispatch: str):
        if dispatch not in ("static", "queue"):
            raise ValueError(f"dispatch = {dispatch!r}: expected static or queue")
        self.decoders, self.dispatch = decoders, dispatch
        self.queue = decoders[0].queue if dispatch == "queue" else None
        if dispatch == "queue":
            if any(d.queue is not self.queue for d in decoders):
                raise ValueError("queue dispatch needs decoders built on one shared queue")
            for d in decoders:
                d.pool = self

    def submit_batch(self, reqs: list[Request]) -> None:
        """Submit a batch: static splits it into len(decoders) contiguous shares, queue dispatches each request."""
        if self.dispatch == "queue":
            for r in reqs:
                self.submit(r)
            return
        n = len(self.decoders)
        per, extra = divmod(len(reqs), n)
        start = 0
        for i, d in enumerate(self.decoders):
            share = reqs[start:start + per + (i < extra)]
            start += len(share)
            d.queue.extend(share)
            if share:
                d.poke()

    def submit(self, req: Request) -> None:
        """Queue dispatch: to the device with the largest free share of its capacity, or onto the shared queue
        (pulled by the first device that frees a slot) when every device is full."""
        if self.dispatch != "queue":
            min(self.decoders, key=lambda d: d.load()).submit(req)
            return
        best, best_free = None, 0.0
        for d in self.decoders:
            cap = d.capacity()
            free = (cap - len(d.active) - len(d.inbox)) / cap if cap > 0 else 0.0
            if free > best_free:
                best, best_free = d, free
        if best is None:
            self.queue.append(req)
            self.poke_all()
        else:
            best.inbox.append(req)
            best.poke()

    def spare(self, dec: Decoder) -> None:
        """`dec` has free slots and the queue is empty (a hook: the elastic pool moves work back to it)."""

    def poke_all(self) -> None:
        for d in self.decoders:
            d.poke()

    def pause_all(self, seconds: float, version: int | None = None):
        """A weight sync on every rollout device; yields until all are done (use with `yield from`). With
        `version`, partial-rollout devices interrupt their sequences in flight (Decoder.pause)."""
        events = [d.pause(seconds, version) for d in self.decoders]
        yield self.decoders[0].env.all_of(events)

    def set_version(self, version: int) -> None:
        for d in self.decoders:
            d.version = version
            if d.deferred and d.partial:  # credo's worker asks after every token whether newer weights exist
                d.poke(force=True)


def make_pool(env: simpy.Environment, costs: Costs, devices: int, max_batch: int, *, static: bool,
              dispatch: str) -> Pool:
    """`devices` decoders (static = transformers generate calls) behind one dispatch policy."""
    shared = deque() if dispatch == "queue" else None
    decoders = [Decoder(env, costs, max_batch, f"rollout{i}", static=static,
                        queue=shared if shared is not None else deque()) for i in range(devices)]
    return Pool(decoders, dispatch)
