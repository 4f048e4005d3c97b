"""The generation service (`credo.distributed.service`) over the hf backend (`HFBackend`), as an adapter.

Two ways to step the engine:

- `chunk_tokens=0` (whole requests): an engine step runs every waiting request to its end, one `HFBackend.generate`
  call per distinct sampling setting, in submission order. The results are exactly `generate`'s for the same prompts
  and seeds (the same call). A running request cannot be interrupted: `abort` stops only a waiting one.
- `chunk_tokens=k` (needs `per_sample_seeds=True`): an engine step decodes up to k tokens of every running request,
  each continued from its prompt + partial response, the seeded noise taken at its own response positions
  (`first_positions`), so a request draws the tokens one whole call would have drawn (up to the logits themselves
  being computed in another batch shape). Between steps a request may be aborted (its result keeps the tokens and
  log-probs so far), new requests join (continuous batching) and new weights load (the next tokens carry the new
  version). Each step re-reads the whole context: no KV cache is kept across steps (the price of the adapter).

The engine runs in the caller's thread, inside `take()` or `step()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from credo.distributed.service import (GenerationRequest, GenerationResult, SamplingSettings, ServiceCapabilities,
                                       check_request)


@dataclass
class _Request:
    handle: int
    request: GenerationRequest
    tokens: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    versions: list = field(default_factory=list)

    def result(self, reason: str, version: int) -> GenerationResult:
        return GenerationResult(self.handle, list(self.request.prompt_ids), self.tokens, self.log_probs, self.versions,
                                reason, meta={"seed": self.request.seed, "version": version})


class HFGenerationService:
    """`GenerationService` over an `HFBackend` (see the module docstring)."""

    def __init__(self, backend, *, chunk_tokens: int = 0):
        if chunk_tokens < 0:
            raise ValueError(f"chunk_tokens is {chunk_tokens}, expected >= 0 (0 = whole requests per engine step)")
        if chunk_tokens and not backend.per_sample_seeds:
            raise ValueError("chunk_tokens > 0 needs HFBackend(per_sample_seeds=True): a request continued from its "
                             "partial response must draw what one call would have drawn")
        self.backend, self.chunk_tokens = backend, chunk_tokens
        chunked = chunk_tokens > 0
        self.capabilities = ServiceCapabilities(abort_in_flight=chunked, weights_in_flight=chunked,
                                                continuous_batching=chunked, per_sample_seeds=backend.per_sample_seeds)
        self._next = 0
        self._waiting: dict[int, _Request] = {}
        self._running: dict[int, _Request] = {}
        self._done: list[GenerationResult] = []

    def submit(self, request: GenerationRequest) -> int:
        check_request(request)
        if request.seed is None and self.chunk_tokens:
            raise ValueError("GenerationRequest.seed is None (greedy) but chunk_tokens > 0 continues requests by their "
                             "seeded noise; expected an int seed, or chunk_tokens=0")
        handle, self._next = self._next, self._next + 1
        self._waiting[handle] = _Request(handle, request)
        return handle

    def abort(self, handle: int) -> bool:
        """Stop a waiting or (chunked) running request; its result, with the tokens so far, comes with the next
        take(). False when it is not in flight (finished, aborted or unknown)."""
        req = self._waiting.pop(handle, None) or self._running.pop(handle, None)
        if req is None:
            return False
        self._done.append(req.result("abort", self.backend.version))
        return True

    def load_weights(self, model, version: int) -> None:
        """The backend takes `model`'s weights (`HFBackend.sync_weights`); tokens decoded after this carry `version`."""
        self.backend.sync_weights(model, version)

    def in_flight(self) -> int:
        return len(self._waiting) + len(self._running)

    def take(self, *, wait: bool = True) -> list[GenerationResult]:
        """The results finished or aborted since the last take, in that order. `wait`: first run engine steps until
        there is one (or nothing is in flight)."""
        while wait and not self._done and self.in_flight():
            self.step()
        out, self._done = self._done, []
        return out

    def step(self) -> None:
        """One engine step (see the module docstring)."""
        if not self.chunk_tokens:
            batch, self._waiting = list(self._waiting.values()), {}
            for (settings, _), reqs in _by_settings(batch, whole=True).items():
                self._decode(reqs, settings, settings.max_new_tokens)
            return
        self._running.update(self._waiting)  # continuous batching: waiting requests join the running ones
        self._waiting = {}
        for (settings, _), reqs in _by_settings(list(self._running.values()), whole=False).items():
            room = min(r.request.sampling.max_new_tokens - len(r.tokens) for r in reqs)
            self._decode(reqs, settings, min(self.chunk_tokens, room), continued=True)

    def close(self) -> None:
        self._waiting, self._running = {}, {}

    def _decode(self, reqs: list[_Request], s: SamplingSettings, tokens: int, continued: bool = False) -> None:
        """Decode up to `tokens` new tokens of each of `reqs` (one generate call); finished ones go to the results."""
        kw = dict(max_new_tokens=tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                  seeds=None if reqs[0].request.seed is None else [r.request.seed for r in reqs])
        if continued:
            kw["first_positions"] = [len(r.tokens) for r in reqs]
        samples = self.backend.generate([list(r.request.prompt_ids) + r.tokens for r in reqs], **kw)
        version = self.backend.version
        for r, s_ in zip(reqs, samples):
            r.tokens += s_.response_ids
            r.log_probs += s_.rollout_log_probs
            r.versions += [version] * len(s_.response_ids)
            if s_.finished or len(r.tokens) >= r.request.sampling.max_new_tokens:
                self._running.pop(r.handle, None)
                self._done.append(r.result("stop" if s_.finished else "length", version))


def _by_settings(reqs: list[_Request], *, whole: bool) -> dict:
    """Requests grouped by what one generate call shares, in submission order: all settings for whole requests; all
    but the length cap for chunks (each chunk is capped by the group's least room)."""
    groups: dict = {}
    for r in sorted(reqs, key=lambda r: r.handle):
        s = r.request.sampling
        key = s if whole else SamplingSettings(1, s.temperature, s.top_p, s.top_k, s.min_p)
        groups.setdefault((key, r.request.seed is None), []).append(r)  # greedy and seeded never share a call
    return groups
