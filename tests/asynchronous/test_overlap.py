"""overlap: rollout worker processes against the trainer's own scoring, and the staleness bound under a slow trainer,
a slow rollout and out-of-order workers; a dead worker is an error that names it, never a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from credo.distributed.rollout import HFBackend
from credo.distributed.rollout_workers import GenerationRequest, LocalRolloutWorkers, RolloutWorkerError, WorkerSpec
from credo.schedules.overlap import OverlapSource
from credo.train.scoring import policy_forward
from tests.asynchronous.common import arithmetic, perturb, prompt_rollout, tiny_policy

pytestmark = pytest.mark.slow  # each test starts worker processes (torch + transformers imports)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
        path, model, tok = tiny_policy(None)
        yield path, model, tok, arithmetic()


def workers_for(path, model, tok, n=1, timeout_s=600.0, partial=False):  # generous: a loaded shared CPU
    spec = WorkerSpec(policy_path=path, dtype="float32", eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      partial_rollout=partial)
    return LocalRolloutWorkers(model, spec, n, timeout_s=timeout_s)


def scored(model, samples):
    """The trainer's log-probs of each sample's response tokens (the sampler's temperature, 1.0)."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        mask = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
        mask[0, len(s.prompt_ids) - 1:] = True
        lp, _ = policy_forward(model, ids, torch.ones_like(ids), mask, temperature=1.0, chunk_size=64,
                               with_entropy=False)
        out.append(lp[0, len(s.prompt_ids) - 1:])
    return out


def test_a_worker_samples_with_the_published_weights_and_stamps_their_version(tiny):
    path, model, tok, _ = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    pool = workers_for(path, model, tok)
    try:
        prompts = [tok("3+4=", add_special_tokens=False)["input_ids"]] * 6
        for version in (1, 2):
            perturb(model, version)  # weights the worker's own copy (from the folder) does not have
            pool.publish(model, version)
            pool.submit(0, GenerationRequest(version, prompts, list(range(6)), max_new_tokens=5))
            result = pool.next_result(120)
            assert result.version == version and {s.policy_version for s in result.samples} == {version}
            with torch.no_grad():
                for s, lp in zip(result.samples, scored(model, result.samples)):
                    torch.testing.assert_close(torch.tensor(s.rollout_log_probs), lp, atol=1e-5, rtol=0)
        assert pool.busy_seconds()[0] > 0
        pid = pool.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        with pytest.raises(RolloutWorkerError, match=f"rollout worker 0 \\(pid {pid}\\) died with exit code -9"):
            pool.next_result(60)
        assert time.monotonic() - t < 5  # noticed at the next poll, not at the timeout
    finally:
        pool.close()
        model.load_state_dict(start)


def drive(source, model, steps: int, train_s: float = 0.0) -> list:
    """The trainer's loop around a source: rollout, an 'update' of train_s seconds, sync."""
    batches = []
    for k in range(1, steps + 1):
        batches.append(source.rollout(k))
        time.sleep(train_s)
        perturb(model, k)
        source.sync(model, k)
    return batches


def overlap(path, model, tok, task, *, S, workers=1, timeout_s=600.0, **kw):
    pool = workers_for(path, model, tok, n=workers, timeout_s=timeout_s, partial=kw.get("partial", False))
    return OverlapSource(prompt_rollout(task, tok, HFBackend(model, tok)), pool, model, staleness=S,
                         timeout_s=timeout_s, last_step=100, **{"stale_policy": "drop", "request_prompts": 0, **kw})


def ages(batch) -> list[int]:
    return [batch.step - 1 - s.policy_version for s in batch.samples]


def test_a_slow_trainer_lets_generation_run_exactly_s_versions_ahead_and_no_further(tiny):
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    source = overlap(path, model, tok, task, S=2)
    try:
        batches = drive(source, model, 6, train_s=0.5)
    finally:
        source.close()
        model.load_state_dict(start)
    for b in batches:
        assert len(b) == 12 and max(ages(b)) <= 2
    # the worker was never the bottleneck: it generated each batch as soon as the gate let it, S steps ahead
    assert [max(ages(b)) for b in batches[3:]] == [2, 2, 2]
    assert all(b.metrics["async/trainer_idle_frac"] < 0.2 for b in batches[3:])


def test_a_slow_rollout_keeps_the_bound_and_the_trainer_waits(tiny, monkeypatch):
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setenv("CREDO_FAULT_ROLLOUT_DELAY_S", "0.6")  # read by the workers at their start
    source = overlap(path, model, tok, task, S=1, request_prompts=1)
    try:
        batches = drive(source, model, 4)
    finally:
        source.close()
        model.load_state_dict(start)
    for b in batches:
        assert max(ages(b)) <= 1
        assert b.metrics["async/staleness_mean"] == sum(ages(b)) / len(b)
    assert all(b.metrics["async/trainer_idle_frac"] > 0.5 for b in batches[1:])
    assert all(b.metrics["async/rollout_idle_frac"] < 0.5 for b in batches[1:])


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_out_of_order_workers_make_stale_groups_that_are_dropped_unless_kept(tiny, monkeypatch, policy):
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setenv("CREDO_FAULT_ROLLOUT_DELAY_S", "0:1.0")  # worker 0 far slower than worker 1
    source = overlap(path, model, tok, task, S=1, workers=2, request_prompts=1, replicate=False, stale_policy=policy)
    try:  # worker 1 finishes the later steps' prompts first; worker 0's come back when the trainer has moved on
        batches = drive(source, model, 6, train_s=0.4)
    finally:
        source.close()
        model.load_state_dict(start)
    dropped = sum(b.metrics["async/dropped_stale"] for b in batches)
    stalest = max(max(ages(b)) for b in batches)
    if policy == "drop":
        assert stalest <= 1 and dropped > 0
        assert all(b.metrics["async/stale_frac"] == 0 for b in batches)
    else:
        assert stalest > 1 and dropped == 0
        assert any(b.metrics["async/stale_frac"] > 0 for b in batches)
    for b in batches:  # whole groups, of the G samples of one prompt each
        assert len(b) == 12 and b.group_ids.tolist() == [i // 4 for i in range(12)]
        assert len({(b.problems[i].prompt, b.samples[i].prompt_ids[0]) for i in range(0, 12, 4)}) >= 1


def test_a_worker_killed_mid_run_stops_the_rollout_with_its_name(tiny, monkeypatch):
    path, model, tok, task = tiny
    monkeypatch.setenv("CREDO_FAULT_ROLLOUT_DELAY_S", "2")
    source = overlap(path, model, tok, task, S=1, timeout_s=30)
    try:
        source.publish(0)
        source.next_n = 0
        source.top_up()
        while not source.workers.busy_seconds()[0] and not source.workers.procs[0].is_alive():
            time.sleep(0.05)
        os.kill(source.workers.procs[0].pid, signal.SIGKILL)
        t = time.monotonic()
        with pytest.raises(RolloutWorkerError, match="rollout worker 0 .* died with exit code -9"):
            source.rollout(1)
        assert time.monotonic() - t < 10
    finally:
        source.close()


def test_partial_rollout_in_a_worker_continues_requests_under_new_weights_with_per_token_versions(tiny, monkeypatch):
    """Weights published mid-request interrupt it: the later tokens carry the new version and its log-probs (scored
    here by the trainer's forward at each version), the staleness counts from the oldest token."""
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setenv("CREDO_FAULT_TOKEN_DELAY_S", "0.03")  # slow decoding, so updates land inside requests
    source = overlap(path, model, tok, task, S=1, request_prompts=1, partial=True, timeout_s=120)
    states, batches = {0: {k: v.clone() for k, v in start.items()}}, []
    try:
        for k in range(1, 5):
            batches.append(source.rollout(k))
            perturb(model, k)
            states[k] = {n: v.clone() for n, v in model.state_dict().items()}
            source.sync(model, k)
    finally:
        source.close()
    try:
        spans = [max(s.policy_versions) - min(s.policy_versions) for b in batches for s in b.samples]
        assert max(spans) >= 1  # some request was continued under newer weights
        for b in batches:
            assert max(ages(b)) <= 1 and b.metrics["async/version_span_max"] <= 2
            assert b.metrics["async/interrupted_frac"] == sum(bool(s.meta["interrupted"]) for s in b.samples) / len(b)
            assert sorted({s.meta["stream_index"] for s in b.samples}) == list(range((b.step - 1) * 3, b.step * 3))
        for s in [s for b in batches for s in b.samples if s.meta["interrupted"]][:6]:
            assert s.policy_version == min(s.policy_versions)
            want = []
            for v in sorted(set(s.policy_versions)):
                model.load_state_dict(states[v])
                with torch.no_grad():
                    want.append((torch.tensor(s.policy_versions) == v, scored(model, [s])[0]))
            expect = sum(torch.where(m, lp, torch.zeros_like(lp)) for m, lp in want)
            torch.testing.assert_close(torch.tensor(s.rollout_log_probs), expect, atol=1e-4, rtol=0)
    finally:
        model.load_state_dict(start)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.heavy)])  # 2: ~80 s on a loaded CPU
def test_a_resumed_overlap_stream_trains_every_group_once(tiny, monkeypatch, workers):
    """Checkpointed after step 3 with groups in flight (one worker running ahead; or two out-of-order workers, some
    groups dropped as stale): a new source resumed from the state re-issues those, so no group of the stream is
    trained twice or lost."""
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    if workers == 2:
        monkeypatch.setenv("CREDO_FAULT_ROLLOUT_DELAY_S", "0:0.8")
    kw = dict(S=1, workers=workers, request_prompts=1, replicate=False, timeout_s=300)
    first = overlap(path, model, tok, task, **kw)
    try:
        before = drive(first, model, 3, train_s=0.3 if workers == 2 else 0.0)
        state = first.state_dict()
    finally:
        first.close()
    assert state["pending"] and state["next_n"] > 9  # groups were in flight at the checkpoint
    second = overlap(path, model, tok, task, **kw)
    try:
        second.load_state_dict(state)
        second.sync(model, 3)
        after = []
        for k in (4, 5, 6):
            after.append(second.rollout(k))
            perturb(model, k)
            second.sync(model, k)
        end = second.state_dict()
    finally:
        second.close()
        model.load_state_dict(start)
    trained = [s.meta["stream_index"] for b in before + after for s in b.samples[::4]]
    assert len(trained) == len(set(trained)) == 18  # each trained group once, whole
    assert not first.consumed & second.consumed
    assert first.consumed | second.consumed == set(range(end["next_n"])) - set(end["pending"])
    assert set(trained) <= first.consumed | second.consumed


def test_overlap_at_staleness_0_samples_what_the_synchronous_source_samples(tiny):
    """S = 0: step k's groups are submitted only once version k-1 is published, so the worker process draws, for the
    same prompts and seeds, the synchronous source's tokens (and log-probs up to float rounding), all at version
    k-1."""
    path, model, tok, task = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    sync_source = prompt_rollout(task, tok, HFBackend(model, tok))
    want = drive(sync_source, model, 3)
    model.load_state_dict(start)
    source = overlap(path, model, tok, task, S=0)
    try:
        got = drive(source, model, 3)
    finally:
        source.close()
        model.load_state_dict(start)
    for w, g in zip(want, got):
        assert [s.response_ids for s in g.samples] == [s.response_ids for s in w.samples]
        assert [s.policy_version for s in g.samples] == [s.policy_version for s in w.samples] == [w.step - 1] * 12
        assert [p.prompt for p in g.problems] == [p.prompt for p in w.problems]
        assert g.group_ids.tolist() == w.group_ids.tolist()
        for a, b in zip(g.samples, w.samples):
            torch.testing.assert_close(torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs),
                                       atol=1e-5, rtol=1e-5)  # float rounding: the worker runs its own threads
        assert g.metrics["async/staleness_max"] == 0
