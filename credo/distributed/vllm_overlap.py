"""Overlap's rollout workers as vLLM's asynchronous engine (`stages.schedule: overlap` with `rollout.vllm_engine:
async` and `partial_rollout: true`; docs/vllm.md).

`OverlapSource` talks to its workers through five calls (`credo.distributed.rollout_workers.LocalRolloutWorkers`).
`EngineWorkers` offers them over one `AsyncVLLMBackend`, whose engine core already samples in its own process beside
the trainer:

    submit(0, request)   each prompt of the request becomes one service request (the engine batches them with
                         every other request in flight: continuous batching, no per-request barrier)
    next_result(t)       the first request (in submission order) whose prompts have all ended
    publish(model, v)    `load_weights(model, v)` between two engine steps: the requests in flight stop, are re-read
                         whole (prompt + partial response) under the new weights and continue: partial rollout, as
                         `credo.distributed.partial` does it in the hf workers. Each token carries the version that
                         drew it (vLLM's weight-version spans), a sample's `policy_version` is its oldest token's, and
                         `meta['interrupted']` counts the loads it lived through
    busy_seconds()       the seconds with a request in the engine (its idle time is the rest)

Without partial rollout the hf workers take new weights only between two requests. The async engine loads them
between engine steps whatever is in flight, so the plan refuses overlap with it unless partial_rollout is true.
"""

from __future__ import annotations

import queue
import time

from credo.distributed.rollout import Sample
from credo.distributed.rollout_workers import GenerationResult
from credo.distributed.service import GenerationRequest, SamplingSettings


class EngineWorkers:
    """`LocalRolloutWorkers`' calls over one `AsyncVLLMBackend` (module docstring); one 'worker': the engine."""

    def __init__(self, backend):
        self.backend = backend
        self.procs = [backend]
        self.outstanding = [0]
        self._requests: dict[int, tuple[list[int], int]] = {}  # request id -> (handles, version at submission)
        self._owner: dict[int, int] = {}  # handle -> request id
        self._ended: dict[int, object] = {}  # handle -> its GenerationResult
        self._busy, self._since = 0.0, None

    def publish(self, model, version: int) -> None:
        if self.backend.version != version:  # OverlapSource.sync has the trainer's source load it first
            self.backend.load_weights(model, version)

    def submit(self, worker: int, request) -> None:
        if worker != 0:
            raise ValueError(f"EngineWorkers has one worker (the engine), got worker {worker}")
        settings = SamplingSettings(request.max_new_tokens, request.temperature, request.top_p)
        if self._since is None:
            self._since = time.perf_counter()
        handles = [self.backend.submit(GenerationRequest(tuple(p), settings, int(s)))
                   for p, s in zip(request.prompts, request.seeds)]
        self._requests[request.id] = (handles, self.backend.version)
        self._owner.update({h: request.id for h in handles})
        self.outstanding[0] += 1

    def next_result(self, timeout_s: float) -> GenerationResult | None:
        """The oldest request whose prompts have all ended; None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for rid, (handles, version) in self._requests.items():
                if all(h in self._ended for h in handles):
                    del self._requests[rid]
                    self.outstanding[0] -= 1
                    self._clock()
                    return GenerationResult(rid, 0, [as_sample(self._ended.pop(h)) for h in handles], version)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                ended = self.backend.take(timeout=left)
            except queue.Empty:
                return None
            if not ended and not self.backend.in_flight():  # nothing left that could complete a request
                return None
            self._ended.update({r.handle: r for r in ended})

    def busy_seconds(self) -> list[float]:
        now = time.perf_counter()
        return [self._busy + (now - self._since if self._since is not None else 0.0)]

    def close(self) -> None:
        for handles, _ in self._requests.values():
            for h in handles:
                self.backend.abort(h)
        self._requests = {}

    def _clock(self) -> None:
        if not self._requests and self._since is not None:  # the engine holds nothing of ours: it idles from now
            self._busy += time.perf_counter() - self._since
            self._since = None


def as_sample(result) -> Sample:
    """A service result as a partial-rollout `Sample`: per-token versions, the oldest as its version, and the number
    of weight loads it lived through (its distinct versions - 1)."""
    versions = list(result.policy_versions)
    return Sample(list(result.prompt_ids), list(result.response_ids), [1] * len(result.response_ids),
                  list(result.log_probs), result.finished, min(versions) if versions else result.meta["version"],
                  meta={"interrupted": len(set(versions)) - 1 if versions else 0}, policy_versions=versions)
