"""Rollout as a client of the generation service (credo/distributed/service_client.py): `generate_through` over
`WholeRequestService` returns exactly what one `generate` call returns (the engine's own samples, kept sets included),
greedy and seeded apart, settings grouped in submission order; the engine gets only the options a request sets; an
engine that implements the service itself is used as it is."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.hf_service import HFGenerationService
from credo.distributed.rollout import HFBackend, Sample
from credo.distributed.service import GenerationRequest, GenerationResult, GenerationService, SamplingSettings
from credo.distributed.service_client import WholeRequestService, as_service, generate_through
from tests.fakes import sharp_tiny_policy

TEXTS = ["1+2=", "33+4=", "7=", "12+34=", "5+5=", "98+76="]
SEEDS = [11, 22, 33, 44, 55, 66]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 8.0)
    return model, tok, [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def same(a: Sample, b: Sample) -> None:
    assert (a.prompt_ids, a.response_ids, a.response_mask, a.rollout_log_probs, a.finished, a.policy_version) == (
        b.prompt_ids, b.response_ids, b.response_mask, b.rollout_log_probs, b.finished, b.policy_version)
    assert a.kept_thresholds == b.kept_thresholds and a.policy_versions == b.policy_versions


@pytest.mark.parametrize("kw", [dict(seeds=SEEDS), dict(seeds=None),
                                dict(seeds=SEEDS, top_k=3, kept_set=True)], ids=["seeded", "greedy", "top_k_kept"])
def test_generate_through_equals_one_generate_call(tiny, kw):
    model, tok, prompts = tiny
    backend = HFBackend(model, tok)
    want = backend.generate(prompts, max_new_tokens=6, temperature=0.8, top_p=0.9, **kw)
    service = as_service(backend)
    assert isinstance(service, WholeRequestService) and isinstance(service, GenerationService)
    got = generate_through(service, prompts, max_new_tokens=6, temperature=0.8, top_p=0.9, **kw)
    assert service.calls == 1 and service.in_flight() == 0
    assert len({tuple(s.response_ids) for s in want}) > 1
    for a, b in zip(got, want):
        same(a, b)
    if kw.get("kept_set"):
        assert all(s.kept_thresholds is not None for s in got)


class Recorder:
    """An engine with a batch `generate` that records its calls and answers with the prompt reversed."""

    def __init__(self):
        self.calls, self.version, self.synced = [], 0, []

    def generate(self, prompts, **kw):
        self.calls.append((list(map(list, prompts)), kw))
        return [Sample(list(p), list(reversed(p)), [1] * len(p), [-0.5] * len(p), True, self.version) for p in prompts]

    def sync_weights(self, model, version):
        self.synced.append(version)
        self.version = version


def test_each_setting_is_one_call_in_submission_order_with_only_the_options_set():
    engine = Recorder()
    service = WholeRequestService(engine)
    a, b = SamplingSettings(4, 1.0, 1.0), SamplingSettings(4, 0.7, 1.0, top_k=5)
    handles = [service.submit(GenerationRequest((1, 2), a, 7)), service.submit(GenerationRequest((3,), b, 8)),
               service.submit(GenerationRequest((4, 5), a, 9)), service.submit(GenerationRequest((6,), a, None))]
    results = {r.handle: r for r in service.take()}
    assert sorted(results) == handles
    assert engine.calls == [
        ([[1, 2], [4, 5]], dict(max_new_tokens=4, temperature=1.0, top_p=1.0, seeds=[7, 9])),
        ([[3]], dict(max_new_tokens=4, temperature=0.7, top_p=1.0, seeds=[8], top_k=5)),
        ([[6]], dict(max_new_tokens=4, temperature=1.0, top_p=1.0, seeds=None)),  # greedy apart from seeded
    ]
    assert results[handles[2]].response_ids == [5, 4] and results[handles[2]].policy_versions == [0, 0]
    service.load_weights(object(), 3)
    (r,) = generate_through(service, [[1]], max_new_tokens=2, temperature=1.0, top_p=1.0, seeds=[1])
    assert engine.synced == [3] and r.policy_version == 3


def test_abort_of_a_waiting_request_and_the_client_errors():
    service = WholeRequestService(Recorder())
    s = SamplingSettings(4)
    keep, drop = service.submit(GenerationRequest((1,), s, 1)), service.submit(GenerationRequest((2,), s, 2))
    assert service.abort(drop) and not service.abort(drop)
    (aborted,) = service.take()  # what is done already comes first, without running the engine
    assert aborted.handle == drop and aborted.finish_reason == "abort" and aborted.response_ids == []
    (kept,) = service.take()
    assert kept.handle == keep and kept.finish_reason == "stop"
    with pytest.raises(ValueError, match="seeds has length 1, expected 2"):
        generate_through(service, [[1], [2]], max_new_tokens=2, temperature=1.0, top_p=1.0, seeds=[1])
    service.submit(GenerationRequest((9,), s, 1))  # another client's request, left in the service
    with pytest.raises(RuntimeError, match="did not submit"):
        generate_through(service, [[1]], max_new_tokens=4, temperature=1.0, top_p=1.0, seeds=[1])
    with pytest.raises(TypeError, match="no generate"):
        WholeRequestService(object())


def test_an_engine_with_its_own_service_is_used_as_it_is(tiny):
    model, tok, prompts = tiny
    backend = HFBackend(model, tok, per_sample_seeds=True)
    own = HFGenerationService(backend, chunk_tokens=2)
    assert as_service(own) is own
    want = backend.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, seeds=SEEDS)
    got = generate_through(own, prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, seeds=SEEDS)
    for a, b in zip(got, want):  # chunked: the same draws (log-probs up to another batch shape's rounding)
        assert a.response_ids == b.response_ids and a.finished == b.finished
        assert torch.allclose(torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs), atol=1e-5)
    with pytest.raises(ValueError, match="seed is None"):
        own.submit(GenerationRequest((1,), SamplingSettings(4), None))


def test_a_sample_spanning_versions_lists_them():
    r = GenerationResult(0, [1], [5, 6, 7], [-1.0, -1.0, -1.0], [2, 2, 3], "stop")
    s = r.sample()
    assert s.policy_version == 2 and s.policy_versions == [2, 2, 3]
    assert GenerationResult(0, [1], [5], [-1.0], [4], "stop").sample().policy_versions is None


def test_a_source_whose_backend_is_replaced_after_construction_samples_through_the_new_one():
    """palette copies the default source and replaces its backend with its LatentBackend (which adds each sample's
    latent): the source's service must follow the backend it holds, not the one it was built with."""
    import copy

    from credo.train.rollout import PromptRollout

    src = PromptRollout.__new__(PromptRollout)  # only the backend matters here
    src.backend = Recorder()
    first = src.service
    wrapped = copy.copy(src)
    wrapped.backend = Recorder()
    assert wrapped.service.backend is wrapped.backend and src.service is first and first.backend is src.backend
