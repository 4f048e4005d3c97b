"""The generation service: the one API a rollout engine offers its clients (issue 52, item 1).

A client submits requests and takes results as they finish, instead of making one blocking `generate` call per
batch; it may abort a request (keeping what it generated so far) and load new weights between engine steps, so that
in-flight requests continue under the new version. Every token of a result records the policy version that sampled
it and its behaviour log-prob under that version (what partial rollout, item 3, needs).

    class GenerationService(Protocol):
        capabilities: ServiceCapabilities
        def submit(self, request: GenerationRequest) -> int            # a handle
        def take(self, *, wait: bool = True) -> list[GenerationResult] # results finished (or aborted) since last take
        def abort(self, handle: int) -> bool                            # stop it at the next step boundary
        def load_weights(self, model, version: int) -> None             # between engine steps
        def in_flight(self) -> int
        def close(self) -> None

Implementations: `credo.distributed.vllm_async.AsyncVLLMBackend` (vLLM's AsyncLLM, `rollout.vllm_engine: async`)
natively; `credo.distributed.hf_service.HFGenerationService` over the hf backend (chunked: aborts and weights between
steps); `credo.distributed.service_client.WholeRequestService` over any engine with a batch `generate` (hf, offline
vLLM, the Ray pool). The schedules' rollouts are clients of it: `service_client.generate_through`
(docs/generation_service.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingSettings:
    """How a request samples: the settings `RolloutBackend.generate` takes, held per request."""

    max_new_tokens: int
    """Generation length cap (>= 1)."""
    temperature: float = 1.0
    """> 0; the log-probs are those of the distribution at this temperature."""
    top_p: float = 1.0
    """Nucleus threshold in (0, 1]."""
    top_k: int = 0
    """Top-k truncation; 0 = off."""
    min_p: float = 0.0
    """Min-p truncation; 0 = off."""
    kept_set: bool = False
    """Record each token's kept-set threshold (`Sample.kept_thresholds`; engines that cannot record nothing)."""
    routing: bool = False
    """Record an MoE policy's routed experts (`Sample.routed_experts`; the hf engine only)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One response to sample: the prompt's token ids, the sampling settings and the seed that fixes its draw."""

    prompt_ids: tuple
    """Prompt token ids (at least one)."""
    sampling: SamplingSettings
    seed: int | None
    """The request's seed (`RolloutBackend.generate`'s `seeds[i]`); None decodes greedily (`seeds=None`)."""


@dataclass
class GenerationResult:
    """What a request produced: all of it when finished, the tokens so far when aborted."""

    handle: int
    prompt_ids: list[int]
    response_ids: list[int]
    """The tokens sampled (up to and including EOS when it finished by EOS)."""
    log_probs: list[float]
    """Per response token: its behaviour log-prob under the weights that sampled it."""
    policy_versions: list[int]
    """Per response token: the version (`load_weights`) of the weights that sampled it."""
    finish_reason: str
    """'stop' (EOS), 'length' (hit max_new_tokens) or 'abort' (aborted: the tokens are the partial output)."""
    meta: dict = field(default_factory=dict)
    engine_sample: Any = None
    """The engine's own `Sample` when it made the request whole in one batch `generate` (WholeRequestService): it
    carries what only the engine records (kept-set thresholds, routed experts, its meta)."""

    @property
    def finished(self) -> bool:
        """Ended with EOS (`Sample.finished`)."""
        return self.finish_reason == "stop"

    def sample(self):
        """As a `credo.distributed.rollout.Sample`; its `policy_version` is that of its oldest token (a sample's
        staleness counts from its oldest token), the current one for an empty response."""
        from credo.distributed.rollout import Sample

        if self.engine_sample is not None:
            return self.engine_sample
        version = min(self.policy_versions) if self.policy_versions else self.meta.get("version", 0)
        spans = list(self.policy_versions) if len(set(self.policy_versions)) > 1 else None  # one version: implied
        return Sample(list(self.prompt_ids), list(self.response_ids), [1] * len(self.response_ids),
                      list(self.log_probs), self.finished, version, meta=dict(self.meta), policy_versions=spans)


@dataclass(frozen=True)
class ServiceCapabilities:
    """What a generation service does beyond submit/take (clients check it rather than the backend's class)."""

    abort_in_flight: bool
    """abort() of a running request keeps the tokens generated so far (False: only a waiting request can be aborted;
    one already running finishes)."""
    weights_in_flight: bool
    """load_weights() between engine steps: a running request continues under the new weights (partial rollout)."""
    continuous_batching: bool
    """A request submitted while others run joins them at the next engine step."""
    per_sample_seeds: bool
    """A request's tokens depend on its own seed only, not on which requests share its engine steps."""


@runtime_checkable
class GenerationService(Protocol):
    """The rollout engine as a service (see the module docstring)."""

    capabilities: ServiceCapabilities

    def submit(self, request: GenerationRequest) -> int: ...

    def take(self, *, wait: bool = True) -> list[GenerationResult]: ...

    def abort(self, handle: int) -> bool: ...

    def load_weights(self, model: Any, version: int) -> None: ...

    def in_flight(self) -> int: ...

    def close(self) -> None: ...


def check_request(request: GenerationRequest) -> None:
    """A ValueError naming the field at fault, at submit time rather than inside an engine step."""
    s = request.sampling
    if not request.prompt_ids:
        raise ValueError("GenerationRequest.prompt_ids is empty, expected at least one token")
    if s.max_new_tokens < 1:
        raise ValueError(f"SamplingSettings.max_new_tokens is {s.max_new_tokens}, expected >= 1")
    if not (s.temperature > 0 and 0 < s.top_p <= 1):
        raise ValueError(f"SamplingSettings temperature={s.temperature}, top_p={s.top_p}: expected temperature > 0 "
                         "and 0 < top_p <= 1")
