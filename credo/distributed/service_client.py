"""Rollout as a client of the generation service (issue 52, item 1): every engine offers the service API, and the
schedules sample through it.

    service = as_service(backend)             # the engine's own service, or WholeRequestService over its generate
    samples = generate_through(service, prompts, max_new_tokens=64, temperature=1.0, top_p=1.0, seeds=seeds)
    service.load_weights(model, version)      # the engine takes the trainer's weights

`as_service` gives an engine that implements `credo.distributed.service.GenerationService` itself (vLLM's AsyncLLM,
`rollout.vllm_engine: async`) as it is, and wraps any other engine with a batch `generate` (the hf backend, offline
vLLM, the Ray pool) in `WholeRequestService`. `generate_through` is the blocking client the synchronous rollout,
tail batching's long rounds and the overlap/fixed-lag workers use: it submits one request per prompt, takes results
until all are back and returns the samples in prompt order, exactly what one `generate` call returned before (the
whole-request adapter makes that one call; the async engine draws each request by its own seed). Partial rollout
uses the service's abort and `load_weights` through `AsyncVLLMBackend` (credo.distributed.vllm_overlap), or the hf
backend's token-by-token loop (credo.distributed.partial); tail batching's short rounds race on the hf backend's KV
cache (credo.distributed.race): neither is a client of this module yet (docs/generation_service.md).
"""

from __future__ import annotations

from credo.distributed.service import (GenerationRequest, GenerationResult, GenerationService, SamplingSettings,
                                       ServiceCapabilities, check_request)


class WholeRequestService:
    """`GenerationService` over any engine with a batch `generate(prompts, *, max_new_tokens, temperature, top_p,
    seeds, ...)`: an engine step runs every waiting request to its end, one `generate` call per distinct sampling
    setting (greedy and seeded apart), in submission order, so a client that submits a batch gets exactly that
    batch's `generate` call. A running request cannot be interrupted (`abort` stops a waiting one), weights load
    between calls. Each result keeps the engine's own `Sample` (`GenerationResult.engine_sample`): what only the
    engine records (kept-set thresholds, routed experts) reaches the trainer unchanged.

    The engine runs in the caller's thread, inside `take()` or `step()`. It is the Ray pool's adapter too: the pool's
    `generate` spreads a call over its workers (credo.distributed.ray.rollout)."""

    def __init__(self, backend):
        if not callable(getattr(backend, "generate", None)):
            raise TypeError(f"{type(backend).__name__} has no generate(prompts, ...): not a rollout engine")
        self.backend = backend
        self.capabilities = ServiceCapabilities(abort_in_flight=False, weights_in_flight=False,
                                                continuous_batching=False,
                                                per_sample_seeds=bool(getattr(backend, "per_sample_seeds", False)))
        self._next = 0
        self._waiting: dict[int, GenerationRequest] = {}
        self._done: list[GenerationResult] = []
        self.calls = 0
        """generate calls made (one per sampling setting per step)."""

    def submit(self, request: GenerationRequest) -> int:
        check_request(request)
        handle, self._next = self._next, self._next + 1
        self._waiting[handle] = request
        return handle

    def abort(self, handle: int) -> bool:
        """Stop a waiting request (its result has no tokens); False when it is not waiting."""
        request = self._waiting.pop(handle, None)
        if request is None:
            return False
        self._done.append(GenerationResult(handle, list(request.prompt_ids), [], [], [], "abort",
                                           meta={"seed": request.seed, "version": self.version}))
        return True

    def load_weights(self, model, version: int) -> None:
        """The engine takes `model`'s weights (`sync_weights`); later samples carry `version`."""
        self.backend.sync_weights(model, version)

    @property
    def version(self) -> int:
        return int(getattr(self.backend, "version", 0))

    def in_flight(self) -> int:
        return len(self._waiting)

    def take(self, *, wait: bool = True) -> list[GenerationResult]:
        """The results finished or aborted since the last take; `wait`: first run the engine on what is waiting."""
        if wait and not self._done and self._waiting:
            self.step()
        out, self._done = self._done, []
        return out

    def step(self) -> None:
        """Every waiting request to its end: one generate call per (sampling setting, greedy or seeded)."""
        groups: dict = {}
        for handle, request in sorted(self._waiting.items()):
            groups.setdefault((request.sampling, request.seed is None), []).append((handle, request))
        self._waiting = {}
        for (s, greedy), reqs in groups.items():
            samples = self.backend.generate([list(r.prompt_ids) for _, r in reqs], max_new_tokens=s.max_new_tokens,
                                            temperature=s.temperature, top_p=s.top_p,
                                            seeds=None if greedy else [r.seed for _, r in reqs], **engine_options(s))
            self.calls += 1
            if len(samples) != len(reqs):
                raise RuntimeError(f"{type(self.backend).__name__}.generate returned {len(samples)} samples for "
                                   f"{len(reqs)} prompts")
            for (handle, r), sample in zip(reqs, samples):
                n = len(sample.response_ids)
                versions = list(sample.policy_versions) if sample.policy_versions else [sample.policy_version] * n
                self._done.append(GenerationResult(
                    handle, list(r.prompt_ids), list(sample.response_ids), list(sample.rollout_log_probs), versions,
                    "stop" if sample.finished else "length", meta={"seed": r.seed, "version": sample.policy_version},
                    engine_sample=sample))

    def close(self) -> None:
        self._waiting = {}


def engine_options(s: SamplingSettings) -> dict:
    """The truncation and recording settings a `generate` call gets: only those set, so an engine (or a test double)
    without them serves every request that does not ask for them."""
    return {k: v for k, v in (("top_k", s.top_k), ("min_p", s.min_p), ("kept_set", s.kept_set),
                              ("routing", s.routing)) if v}


def as_service(backend) -> GenerationService:
    """The engine's generation service: itself when it implements the API, else `WholeRequestService` over it."""
    if isinstance(backend, GenerationService) and hasattr(backend, "capabilities"):
        return backend
    return WholeRequestService(backend)


def generate_through(service: GenerationService, prompts: list[list[int]], *, max_new_tokens: int,
                     temperature: float, top_p: float, seeds: list[int] | None, top_k: int = 0, min_p: float = 0.0,
                     kept_set: bool = False, routing: bool = False) -> list:
    """`generate`'s contract through the service: one request per prompt (`seeds=None`: greedy), blocking until all
    are back; their `Sample`s in prompt order. The caller must be the service's only client while it waits (a result
    it did not submit, or an aborted one, is an error)."""
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
    settings = SamplingSettings(max_new_tokens, temperature, top_p, top_k, min_p, kept_set, routing)
    handles = [service.submit(GenerationRequest(tuple(p), settings, None if seeds is None else int(seeds[i])))
               for i, p in enumerate(prompts)]
    at = {h: i for i, h in enumerate(handles)}
    out: list = [None] * len(prompts)
    missing = len(prompts)
    while missing:
        results = service.take(wait=True)
        if not results:
            raise RuntimeError(f"the generation service has {missing} of {len(prompts)} requests unanswered and "
                               "nothing in flight")
        for r in results:
            i = at.get(r.handle)
            if i is None:  # taken here, it would be lost to the client that submitted it
                raise RuntimeError(f"the generation service returned request {r.handle}, which generate_through did "
                                   "not submit: a service shared by clients needs one taker per result")
            if r.finish_reason == "abort":
                raise RuntimeError(f"request {r.handle} (prompt {i}) was aborted while generate_through waited on it")
            out[i] = r.sample()
            missing -= 1
    return out
