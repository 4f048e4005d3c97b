"""fixed_lag: step k trains on exactly what a synchronous source with the weights of version k-1-S samples for step k,
and its pending batches survive a checkpoint (torch.save) bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.distributed.rollout import HFBackend
from credo.schedules.fixed_lag import FixedLagSource
from tests.asynchronous.common import arithmetic, perturb, prompt_rollout, same_samples, tiny_policy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
        _, model, tok = tiny_policy(None)
        yield model, tok, arithmetic()


def run_lagged(model, tok, task, S: int, steps: int):
    """Drive a FixedLagSource as the trainer does (rollout, update, sync); the batches and every version's weights."""
    lagged = FixedLagSource(prompt_rollout(task, tok, HFBackend(model, tok)), S, last_step=steps)
    weights, batches, pending = {0: copy.deepcopy(model.state_dict())}, {}, {}
    for k in range(1, steps + 1):
        batches[k] = lagged.rollout(k)
        pending[k] = sorted(lagged.pending)
        perturb(model, k)
        lagged.sync(model, k)
        weights[k] = copy.deepcopy(model.state_dict())
    return batches, weights, pending


@pytest.mark.parametrize("S", [1, 2])
def test_each_step_trains_what_the_policy_of_version_k_minus_1_minus_S_samples(tiny, S):
    model, tok, task = tiny
    start = copy.deepcopy(model.state_dict())
    steps = 6
    batches, weights, pending = run_lagged(model, tok, task, S, steps)
    for k in range(1, steps + 1):
        version = max(0, k - 1 - S)
        assert {s.policy_version for s in batches[k].samples} == {version}
        # the reference: a synchronous source, this step's prompts, the weights of that version
        model.load_state_dict(weights[version])
        backend = HFBackend(model, tok)
        backend.sync_weights(model, version)
        want = prompt_rollout(task, tok, backend).rollout(k)
        assert same_samples(batches[k].samples, want.samples), f"step {k}"
        assert batches[k].metrics["async/staleness_mean"] == k - 1 - version
        # nothing is generated for a step past the run's last
        assert pending[k] == list(range(k + 1, min(k + S, steps) + 1))
    # the weights really changed between versions, so the comparison above could fail
    assert not torch.equal(weights[1]["model.embed_tokens.weight"], weights[2]["model.embed_tokens.weight"])
    model.load_state_dict(start)


def test_pending_batches_survive_a_checkpoint_bit_for_bit(tiny, tmp_path):
    model, tok, task = tiny
    start = copy.deepcopy(model.state_dict())
    S = 2
    lagged = FixedLagSource(prompt_rollout(task, tok, HFBackend(model, tok)), S, last_step=10)
    for k in (1, 2, 3):
        lagged.rollout(k)
        perturb(model, k)
        lagged.sync(model, k)
    torch.save(lagged.state_dict(), tmp_path / "source.pt")  # what TrainState does with a state holding tensors
    weights = copy.deepcopy(model.state_dict())
    after = [lagged.rollout(4), lagged.rollout(5)]
    model.load_state_dict(weights)  # the resumed run: the checkpoint's weights, a fresh source, its saved state
    resumed = FixedLagSource(prompt_rollout(task, tok, HFBackend(model, tok)), S, last_step=10)
    resumed.sync(model, 3)
    resumed.load_state_dict(torch.load(tmp_path / "source.pt", weights_only=False))
    again = [resumed.rollout(4), resumed.rollout(5)]
    for a, b in zip(after, again):
        assert same_samples(a.samples, b.samples)
        assert [p.prompt for p in a.problems] == [p.prompt for p in b.problems]
        assert torch.equal(a.group_ids, b.group_ids)
    # without the saved batches the resumed run would train on other samples (the state matters)
    fresh = FixedLagSource(prompt_rollout(task, tok, HFBackend(model, tok)), S, last_step=10)
    assert not same_samples(fresh.rollout(4).samples, after[0].samples)
    model.load_state_dict(start)


def test_a_rollback_or_resume_past_a_pending_step_never_trains_it_twice(tiny):
    model, tok, task = tiny
    lagged = FixedLagSource(prompt_rollout(task, tok, HFBackend(model, tok)), 1, last_step=10)
    lagged.rollout(1)
    lagged.pending[1] = lagged.pending[2]  # a batch of an already trained step left over
    batch = lagged.rollout(3)
    assert batch.step == 3 and sorted(lagged.pending) == [4]


def test_zero_staleness_is_refused_it_is_the_synchronous_source():
    with pytest.raises(ValueError, match="staleness is 0"):
        FixedLagSource(object(), 0, last_step=3)
