"""RayRolloutBackend on a real local Ray with real tiny transformers models: the same tokens as the in-process backend
for 1, 2 and 4 workers and while workers join and leave, weight pushes (a delta is bitwise a full push), and a
worker killed mid-call replaced with its shard redone."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from credo.distributed.ray.runtime import ClusterWorkerError
from credo.distributed.ray.weights import state_digest, wire_state
from credo.distributed.rollout import HFBackend
from tests.ray.common import encode, start_local_ray, tiny_policy, token_ids, train_step

pytest.importorskip("ray")

TEXTS = ["1+2=", "33+4=", "7=", "12+34=", "5+5=", "98+76=", "40+2=", "8+13="]
KW = dict(max_new_tokens=8, temperature=0.9, top_p=0.95)
LONG = dict(KW, max_new_tokens=48)  # calls long enough to be interrupted mid-way


@pytest.fixture(scope="module")
def ray_local():
    ray = start_local_ray(num_cpus=4)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_policy(tmp_path_factory.mktemp("ray-rollout"))


def reference(model, tok, prompts, seeds, sampling=KW, **kw):
    return HFBackend(model, tok, per_sample_seeds=True, **kw).generate(prompts, seeds=seeds, **sampling)


def wait_until(cond, timeout=60.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not reached"
        time.sleep(0.01)


def test_one_two_and_four_workers_draw_the_same_tokens_while_workers_join_and_leave(ray_local, policy):
    from credo.distributed.ray.rollout import RayRolloutBackend

    path, model, tok = policy
    prompts, seeds = encode(tok, TEXTS * 4), list(range(1000, 1032))
    want = token_ids(reference(model, tok, prompts, seeds))
    assert len({tuple(t) for t in want}) > 8  # the draws vary, so equal lists mean something
    backend = RayRolloutBackend(path, workers=4, resources={"CPU": 0.5}, elastic=(1, 4))
    try:
        got4 = backend.generate(prompts, seeds=seeds, **KW)
        assert token_ids(got4) == want
        assert [s.prompt_ids for s in got4] == prompts
        backend.set_capacity(2)
        assert token_ids(backend.generate(prompts, seeds=seeds, **KW)) == want
        backend.remove_worker()
        got1 = backend.generate(prompts, seeds=seeds, **KW)
        assert token_ids(got1) == want
        torch.testing.assert_close(torch.tensor([lp for s in got1 for lp in s.rollout_log_probs]),
                                   torch.tensor([lp for s in got4 for lp in s.rollout_log_probs]), atol=1e-5, rtol=0)
        m = backend.metrics()
        assert m["cluster/rollout_workers"] == 1 and 0 < m["cluster/rollout_busy_frac"] <= 1

        # a step later: new weights; a worker joins and must sample with them, not with the folder's
        train_step(model, tok)
        backend.sync_weights(model, 1)
        backend.add_worker()
        want1 = token_ids(reference(model, tok, prompts, seeds))
        assert want1 != want
        got = backend.generate(prompts, seeds=seeds, **KW)
        assert token_ids(got) == want1 and {s.policy_version for s in got} == {1}
        assert len(set(backend.digests().values())) == 1

        # a worker leaves mid-call: its unfinished shard is redone by the other, with the same seeds
        long_prompts, long_seeds = prompts * 4, list(range(2000, 2128))
        want_long = token_ids(reference(model, tok, long_prompts, long_seeds, LONG))
        result = {}
        call = threading.Thread(target=lambda: result.update(out=backend.generate(long_prompts, seeds=long_seeds, **LONG)))
        call.start()
        wait_until(lambda: len(backend.running) == 2)
        backend.remove_worker()
        call.join(120)
        assert token_ids(result["out"]) == want_long
        assert backend.redone_shards == 1 and len(backend.active) == 1
    finally:
        backend.close()


def test_a_delta_push_is_bitwise_a_full_push_and_sends_less(ray_local, policy):
    """bf16 rollout copies of an fp32 policy: after real Adam steps, the worker pushed full and the one pushed deltas
    hold the same bits as the trainer's weights cast here, and sample what the in-process bf16 backend samples. Both
    push in 1 KiB buckets of the trainer's tensors (about one tensor each, a bucket loaded after another)."""
    from credo.distributed.ray.rollout import RayRolloutBackend

    path, _, tok = policy
    from credo.models import load_causal_lm

    model = load_causal_lm(path)
    common = dict(workers=1, resources={"CPU": 0.5}, dtype="bfloat16", bucket_bytes=1024)
    full = RayRolloutBackend(path, sync="full", **common)
    delta = RayRolloutBackend(path, sync="delta", initial_model=model, **common)
    try:
        prompts, seeds = encode(tok, TEXTS), list(range(8))
        fractions = []
        for step in (1, 2, 3):
            train_step(model, tok, lr=1e-4)
            full.sync_weights(model, step)
            delta.sync_weights(model, step)
            here = state_digest(wire_state(model, torch.bfloat16))
            assert list(full.digests().values()) == [here] == list(delta.digests().values())
            m = delta.metrics()
            fractions.append(m["cluster/rollout_sync_changed_frac"])
            assert m["cluster/rollout_sync_bytes"] < m["cluster/rollout_sync_full_bytes"]
            assert full.metrics()["cluster/rollout_sync_bytes"] == m["cluster/rollout_sync_full_bytes"]
        assert all(0 < f < 1 for f in fractions), fractions
        want = token_ids(reference(model, tok, prompts, seeds, dtype="bfloat16"))
        assert token_ids(full.generate(prompts, seeds=seeds, **KW)) == want
        assert token_ids(delta.generate(prompts, seeds=seeds, **KW)) == want
    finally:
        full.close()
        delta.close()


def test_a_worker_killed_mid_call_is_replaced_with_the_weights_and_its_shard_redone(ray_local, policy):
    from credo.distributed.ray.rollout import RayRolloutBackend

    path, model, tok = policy
    backend = RayRolloutBackend(path, workers=2, resources={"CPU": 0.5}, max_restarts=1, sync="delta",
                                initial_model=model, bucket_bytes=1024)  # the replacement gets the weights in buckets
    try:
        train_step(model, tok)
        backend.sync_weights(model, 7)
        prompts, seeds = encode(tok, TEXTS * 16), list(range(5000, 5128))
        want = token_ids(reference(model, tok, prompts, seeds, LONG))
        result = {}
        call = threading.Thread(target=lambda: result.update(out=backend.generate(prompts, seeds=seeds, **LONG)))
        call.start()
        wait_until(lambda: len(backend.running) == 2)
        victim = backend.active[0]
        os.kill(backend.worker_info()[victim]["pid"], signal.SIGKILL)
        call.join(120)
        assert token_ids(result["out"]) == want and {s.policy_version for s in result["out"]} == {7}
        m = backend.metrics()
        assert m["cluster/rollout_restarts"] == 1 and m["cluster/rollout_redone_shards"] >= 1
        assert len(set(backend.digests().values())) == 1  # the new worker got the current weights
        # a role whose workers keep dying stops with an error naming it
        os.kill(backend.worker_info()[victim]["pid"], signal.SIGKILL)
        with pytest.raises(ClusterWorkerError, match="role 'rollout'.*max_restarts = 1"):
            backend.generate(prompts, seeds=seeds, **KW)
    finally:
        backend.close()


@pytest.mark.heavy  # a pool of its own (~25 s on a loaded host); tests/distributed/test_kept_set_sampling.py is fast
def test_the_pool_passes_truncation_and_returns_the_recorded_kept_sets(ray_local, policy):
    """top_k / min_p / kept_set reach the workers' engines: the pool's samples, kept-set thresholds included, are the
    in-process backend's (docs/truncated_sampling.md)."""
    from credo.distributed.ray.rollout import RayRolloutBackend

    path, model, tok = policy
    prompts, seeds = encode(tok, TEXTS), list(range(2000, 2008))
    sampling = dict(KW, top_k=4, min_p=0.05, kept_set=True)
    want = reference(model, tok, prompts, seeds, sampling=sampling)
    assert all(s.kept_thresholds is not None and len(s.kept_thresholds) == len(s.response_ids) for s in want)
    backend = RayRolloutBackend(path, workers=2, resources={"CPU": 0.5})
    try:
        assert backend.kept_set_order == "hf"
        got = backend.generate(prompts, seeds=seeds, **sampling)
    finally:
        backend.close()
    assert token_ids(got) == token_ids(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.kept_thresholds), torch.tensor(w.kept_thresholds), atol=1e-5,
                                   rtol=0)


def test_the_pool_races_and_carries_soft_prompts_as_the_in_process_backend_does(ray_local, policy):
    """Tail batching's race runs whole on one worker, and soft prefixes travel with their shard: the pool returns
    what the in-process backend returns for the same weights (the race: the same winners, finish steps and cost)."""
    from credo.distributed.ray.rollout import RayRolloutBackend

    path, model, tok = policy
    prompts, seeds = encode(tok, TEXTS * 2), list(range(3000, 3016))
    groups = [i // 2 for i in range(len(prompts))]
    race = dict(need=2, groups_needed=1, max_new_tokens=64, temperature=0.9, top_p=0.95, chunk_tokens=1)
    want_race = HFBackend(model, tok, per_sample_seeds=True).generate_race(prompts, groups, seeds=seeds, **race)
    d = model.get_input_embeddings().embedding_dim
    prefix = torch.randn(len(prompts), 3, d, generator=torch.Generator().manual_seed(0)) * 0.5
    want_soft = HFBackend(model, tok, per_sample_seeds=True).generate(prompts, seeds=seeds, prefix_embeds=prefix, **KW)
    assert token_ids(want_soft) != token_ids(reference(model, tok, prompts, seeds))  # the prefix changes the draws
    backend = RayRolloutBackend(path, workers=2, resources={"CPU": 0.5}, initial_model=model)
    try:
        got_soft = backend.generate(prompts, seeds=seeds, prefix_embeds=prefix, **KW)
        got_race = backend.generate_race(prompts, groups, seeds=seeds, **race)
        # an error the worker's engine raises reaches the caller as itself, pointing at the worker's own log
        with pytest.raises(ValueError, match=r"prefix_embeds has shape \[8, 3, %d\]" % (d + 1)) as raised:
            backend.generate(prompts, seeds=seeds, prefix_embeds=torch.zeros(len(prompts), 3, d + 1), **KW)
        assert any("worker's own log" in n and "/logs" in n for n in raised.value.__notes__)
    finally:
        backend.close()
    assert token_ids(got_soft) == token_ids(want_soft)
    assert got_race.finish_steps == want_race.finish_steps and got_race.decoded_tokens == want_race.decoded_tokens
    assert [s is None for s in got_race.samples] == [s is None for s in want_race.samples]
    assert any(s is None for s in want_race.samples)  # the race did stop requests early
    assert token_ids([s for s in got_race.samples if s]) == token_ids([s for s in want_race.samples if s])
