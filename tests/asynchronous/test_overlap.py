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


def workers_for(path, model, tok, n=1, timeout_s=600.0):  # generous: a loaded shared CPU
    spec = WorkerSpec(policy_path=path, dtype="float32", eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
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
    pool = workers_for(path, model, tok, n=workers, timeout_s=timeout_s)
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
