"""The generation service over the hf backend (credo/distributed/hf_service.py) against `HFBackend.generate`:
results equal generate's for the same seeds, whole or in chunks; an aborted request keeps exactly the tokens and
log-probs decoded before the abort; requests join running ones; tokens record the weights' version."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.distributed.hf_service import HFGenerationService
from credo.distributed.rollout import HFBackend
from credo.distributed.service import GenerationRequest, GenerationService, SamplingSettings
from tests.fakes import sharp_tiny_policy

TEXTS = ["1+2=", "33+4=", "7=", "12+34=", "5+5=", "98+76="]
SEEDS = [11, 22, 33, 44, 55, 66]
SETTINGS = SamplingSettings(max_new_tokens=6, temperature=0.8, top_p=0.9)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 8.0)
    return model, tok, [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def generated(backend, prompts, seeds=SEEDS, s=SETTINGS):
    return backend.generate(prompts, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                            seeds=seeds)


def submit_all(service, prompts, seeds=SEEDS, s=SETTINGS) -> list[int]:
    return [service.submit(GenerationRequest(tuple(p), s, seed)) for p, seed in zip(prompts, seeds)]


def by_handle(results) -> dict:
    return {r.handle: r for r in results}


@pytest.mark.parametrize("per_sample_seeds", [False, True])
def test_whole_requests_equal_generate_for_the_same_seeds(tiny, per_sample_seeds):
    model, tok, prompts = tiny
    backend = HFBackend(model, tok, per_sample_seeds=per_sample_seeds)
    want = generated(backend, prompts)
    service = HFGenerationService(backend)
    assert isinstance(service, GenerationService) and not service.capabilities.abort_in_flight
    handles = submit_all(service, prompts)
    got = by_handle(service.take())
    assert sorted(got) == handles and service.in_flight() == 0
    assert len({tuple(s.response_ids) for s in want}) > 1
    for h, s in zip(handles, want):  # the same generate call: bitwise
        assert got[h].response_ids == s.response_ids and got[h].log_probs == s.rollout_log_probs
        assert got[h].finished == s.finished and got[h].sample().policy_version == s.policy_version == 0


def test_chunked_requests_draw_what_one_call_draws(tiny):
    model, tok, prompts = tiny
    backend = HFBackend(model, tok, per_sample_seeds=True)
    want = generated(backend, prompts)
    service = HFGenerationService(backend, chunk_tokens=2)
    handles = submit_all(service, prompts)
    got = {}
    while service.in_flight():
        got.update(by_handle(service.take()))
    for h, s in zip(handles, want):
        assert got[h].response_ids == s.response_ids, h
        assert got[h].finish_reason == ("stop" if s.finished else "length")
        # continued from the partial response in another batch shape: the same numbers up to float rounding
        torch.testing.assert_close(torch.tensor(got[h].log_probs), torch.tensor(s.rollout_log_probs), atol=1e-4, rtol=0)


def test_an_aborted_request_keeps_exactly_what_was_decoded_before_the_abort(tiny):
    model, tok, prompts = tiny
    full, cut = (HFGenerationService(HFBackend(model, tok, per_sample_seeds=True), chunk_tokens=2) for _ in range(2))
    handles = submit_all(full, prompts)
    submit_all(cut, prompts)
    want = {}
    while full.in_flight():
        want.update(by_handle(full.take()))
    cut.step()  # one engine step: 2 tokens of every request
    early = by_handle(cut.take(wait=False))
    running = [h for h in handles if h not in early]
    assert running, "every request ended in the first chunk: the test needs one still running"
    h = running[0]
    assert cut.abort(h) and not cut.abort(h)
    (aborted,) = cut.take(wait=False)
    assert aborted.handle == h and aborted.finish_reason == "abort" and not aborted.finished
    assert len(aborted.response_ids) == 2
    assert aborted.response_ids == want[h].response_ids[:2]
    assert aborted.log_probs == want[h].log_probs[:2]  # the same first engine step: bitwise
    rest = {}
    while cut.in_flight():
        rest.update(by_handle(cut.take()))
    assert h not in rest and sorted(rest) == sorted(set(running) - {h})
    assert all(rest[k].response_ids == want[k].response_ids for k in rest)


def test_requests_join_running_ones_and_tokens_carry_the_version_that_drew_them(tiny):
    model, tok, prompts = tiny
    backend = HFBackend(copy.deepcopy(model), tok, per_sample_seeds=True)
    alone = generated(HFBackend(model, tok, per_sample_seeds=True), prompts[-1:], SEEDS[-1:])[0]
    service = HFGenerationService(backend, chunk_tokens=2)
    first = submit_all(service, prompts[:3], SEEDS[:3], SamplingSettings(max_new_tokens=6, temperature=0.8,
                                                                           top_p=0.9))
    service.step()
    late = service.submit(GenerationRequest(tuple(prompts[-1]), SETTINGS, SEEDS[-1]))  # joins at the next step
    service.load_weights(backend.model, 3)  # same weights, new version: only the stamps change
    results = by_handle(service.take(wait=False))
    while service.in_flight():
        results.update(by_handle(service.take()))
    assert results[late].response_ids == alone.response_ids and set(results[late].policy_versions) <= {3}
    for h in first:
        r = results[h]
        n0 = min(2, len(r.response_ids))
        assert r.policy_versions == [0] * n0 + [3] * (len(r.response_ids) - n0)
        assert r.sample().policy_version == 0  # a sample is as old as its oldest token


def test_bad_requests_and_settings_are_refused(tiny):
    model, tok, prompts = tiny
    with pytest.raises(ValueError, match="per_sample_seeds=True"):
        HFGenerationService(HFBackend(model, tok), chunk_tokens=2)
    service = HFGenerationService(HFBackend(model, tok))
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        service.submit(GenerationRequest((), SETTINGS, 0))
    with pytest.raises(ValueError, match="max_new_tokens"):
        service.submit(GenerationRequest((1,), SamplingSettings(max_new_tokens=0), 0))
    assert not service.abort(12345)


def test_per_row_positions_draw_the_noise_of_those_positions():
    from credo.distributed.seeded_sampling import gumbel_noise, seed_keys

    keys = seed_keys([3, 4, 5])
    rows = gumbel_noise(keys, torch.tensor([0, 2, 7]), 40)
    for b, pos in enumerate([0, 2, 7]):
        assert torch.equal(rows[b], gumbel_noise(keys, pos, 40)[b])
    assert not torch.equal(rows[1], gumbel_noise(keys, 0, 40)[1])
