"""Concurrent agents' calls sampled together: a `SampleFn` that gathers the prompts of calls arriving within a short
window and samples them in one `generate` call (the multi-turn source samples every live episode's turn in one call;
one call per agent request is the gateway's main cost against it, docs/gateway.md "Throughput").

A call joins a batch only with calls of the same settings (max_new_tokens, temperature, top_p, greedy or seeded);
each keeps its own seeds, and gets back exactly the samples of its own prompts, in order. One worker thread runs the
batches, so `generate` is still called one batch at a time. Off by default (`Gateway(batch_window_s=0)`): with the
hf backend the tokens a seed draws depend on which prompts share the batch (padding, and one RNG stream per call
unless the backend seeds each sample), so a batched run is not reproducible run to run; with per-sample seeds
(vLLM) it is.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from credo.gateway.backend import SampleFn


@dataclass
class _Request:
    prompts: list
    seeds: list | None
    key: tuple
    done: threading.Event = field(default_factory=threading.Event)
    result: list | None = None
    error: BaseException | None = None


class BatchingSampler:
    """`SampleFn` over `sample`: calls within `window_s` of the first waiting one (up to `max_batch` prompts) are
    sampled in one call of `sample`."""

    def __init__(self, sample: SampleFn, window_s: float, max_batch: int = 64):
        if window_s <= 0 or max_batch < 1:
            raise ValueError(f"batching needs window_s > 0 and max_batch >= 1, got {window_s}, {max_batch}")
        self.sample, self.window_s, self.max_batch = sample, window_s, max_batch
        self.pending: list[_Request] = []
        self.cond = threading.Condition()
        self.batches = 0
        """generate calls made (each with one or more requests' prompts)."""
        self.worker = threading.Thread(target=self._run, name="credo-gateway-batcher", daemon=True)
        self.worker.start()

    def __call__(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None) -> list:
        req = _Request([list(p) for p in prompts], None if seeds is None else list(seeds),
                       (max_new_tokens, temperature, top_p, seeds is None))
        with self.cond:
            self.pending.append(req)
            self.cond.notify_all()
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                deadline = time.monotonic() + self.window_s
                while self._waiting(self.pending[0].key) < self.max_batch and time.monotonic() < deadline:
                    self.cond.wait(max(0.0, deadline - time.monotonic()))
                batch, size = [], 0
                for req in list(self.pending):  # the first request's settings, in arrival order, up to max_batch
                    if req.key == self.pending[0].key and (not batch or size + len(req.prompts) <= self.max_batch):
                        batch.append(req)
                        size += len(req.prompts)
                self.pending = [r for r in self.pending if r not in batch]
            self._sample(batch)

    def _waiting(self, key: tuple) -> int:
        return sum(len(r.prompts) for r in self.pending if r.key == key)

    def _sample(self, batch: list[_Request]) -> None:
        max_new_tokens, temperature, top_p, greedy = batch[0].key
        prompts = [p for r in batch for p in r.prompts]
        seeds = None if greedy else [s for r in batch for s in r.seeds]
        try:
            out = self.sample(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              seeds=seeds)
            if len(out) != len(prompts):
                raise RuntimeError(f"the sampler returned {len(out)} samples for {len(prompts)} prompts")
        except BaseException as e:  # noqa: BLE001 - each waiting call raises it (a 500 for its agent)
            for r in batch:
                r.error = e
                r.done.set()
            return
        self.batches += 1
        at = 0
        for r in batch:
            r.result, at = out[at:at + len(r.prompts)], at + len(r.prompts)
            r.done.set()
