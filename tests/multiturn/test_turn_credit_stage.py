"""The turn_credit stage's settings, defaults, checks and metrics, against naive per-turn returns."""

import re

import pytest
import torch

from credo.config import ConfigError
from credo.credit import chunk_ids
from credo.distributed.rollout import Sample
from credo.train.batch import Batch, pack_batch
from credo.families.multiturn.source import EnvReward
from credo.families.multiturn.turn_credit import turn_credit, turn_reward_matrix
from tests.multiturn.common import ctx


def batch_of(*episodes):
    """(turn_rewards, failed) per episode: turns of 2 tokens, one observation token between turns."""
    samples = []
    for rewards, failed in episodes:
        ids, mask = [], []
        for k in range(len(rewards)):
            ids, mask = ids + [9] * bool(k) + [5, 5], mask + [0] * bool(k) + [1, 1]
        samples.append(Sample([1, 2], ids, mask, [0.0] * len(ids), True, 0,
                              {"turn_rewards": list(rewards), "failed": failed}))
    batch = Batch(samples=samples, problems=[None] * len(samples), group_ids=torch.arange(len(samples)))
    EnvReward()(batch)
    pack_batch(batch, 0, overlong_filter=False)
    return batch


def token_values(batch, b):
    """The advantage of each response token of sample b (label-aligned: response token j is column 1 + j)."""
    n = len(batch.samples[b].response_ids)
    return batch.advantages[b, 1:1 + n].tolist()


def per_token(values, n_turns):
    out = []
    for k in range(n_turns):
        out += [0.0] * bool(k) + [values[k]] * 2
    return out


def returns(rewards, gamma):
    g, out = 0.0, []
    for r in rewards[::-1]:
        g = r + gamma * g
        out.insert(0, g)
    return out


def test_the_turn_reward_matrix_pads_every_episode_to_the_longest():
    batch = batch_of(([1.0, 0.5], False), ([0.25], False), ([], True))
    rewards, counts = turn_reward_matrix(batch, chunk_ids(batch.response_mask))
    assert rewards.dtype == torch.float32 and rewards.tolist() == [[1.0, 0.5], [0.25, 0.0], [0.0, 0.0]]
    assert counts.tolist() == [2, 1, 0]
    one = batch_of(([0.5], False), ([1.0], False))
    assert turn_reward_matrix(one, chunk_ids(one.response_mask))[0].tolist() == [[0.5], [1.0]]
    none = batch_of(([], True), ([], True))  # every episode failed at its reset: still one column
    assert turn_reward_matrix(none, chunk_ids(none.response_mask))[0].tolist() == [[0.0], [0.0]]


def test_a_turn_count_that_disagrees_with_the_mask_names_the_sample_and_both_counts():
    batch = batch_of(([1.0], False), ([0.0, 1.0], False))
    batch.samples[1].meta["turn_rewards"] = [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="^" + re.escape(
            "sample 1: the rollout recorded 3 turns but the response mask has 2 chunks; expected one chunk per model "
            "turn") + "$"):
        turn_reward_matrix(batch, chunk_ids(batch.response_mask))
    # a failed (invalid) episode is not checked: it trains on nothing
    batch.valid[1] = False
    rewards, _ = turn_reward_matrix(batch, chunk_ids(batch.response_mask))
    assert rewards.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]


def test_the_defaults_are_batch_normalised_undiscounted_returns():
    episodes = [[0.0, 1.0], [0.5], [-1.0, 0.0, 0.25]]
    batch = batch_of(*[(r, False) for r in episodes])
    turn_credit(ctx())(batch)  # credit mc_rebn, gamma 1, eps 1e-9
    flat = [g for r in episodes for g in returns(r, 1.0)]
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / len(flat)) ** 0.5
    for b, r in enumerate(episodes):
        want = per_token([(g - mean) / (std + 1e-9) for g in returns(r, 1.0)], len(r))
        assert token_values(batch, b) == pytest.approx(want, abs=1e-6), b


def test_eps_and_gamma_reach_the_normalisation():
    episodes = [[0.0, 1.0], [0.5], [-1.0, 0.0, 0.25]]
    batch = batch_of(*[(r, False) for r in episodes])
    turn_credit(ctx(), credit="mc_rebn", gamma=0.5, eps=1.0)(batch)
    flat = [g for r in episodes for g in returns(r, 0.5)]
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / len(flat)) ** 0.5
    for b, r in enumerate(episodes):
        want = per_token([(g - mean) / (std + 1.0) for g in returns(r, 0.5)], len(r))
        assert token_values(batch, b) == pytest.approx(want, abs=1e-6), b


def test_gamma_0_and_1_are_in_range():
    batch = batch_of(([0.5, 1.0], False))
    turn_credit(ctx(), credit="mc", gamma=0.0)(batch)
    assert token_values(batch, 0) == per_token([0.5, 1.0], 2)
    turn_credit(ctx(), credit="ipa", gamma=1.0)(batch)
    assert token_values(batch, 0) == per_token([1.5, 1.0], 2)
    for gamma in (-0.5, 1.5):
        with pytest.raises(ConfigError, match="^" + re.escape(
                f"config key 'stages.advantage_kwargs.gamma' = {gamma} is out of range: expected in [0, 1]") + "$"):
            turn_credit(ctx(), gamma=gamma)


def test_the_metrics_are_the_kept_episodes_turn_count_and_the_mean_turn_reward():
    batch = batch_of(([0.0, 1.0], False), ([0.5], False), ([0.0, 0.0, 0.25], False), ([], True))
    turn_credit(ctx(), credit="mc")(batch)
    # 2, 1 and 3 turns (the failed reset has none and is not kept); six turns pay 0, 1, 0.5, 0, 0, 0.25
    assert batch.metrics["credit/turns_mean"] == 2.0
    assert batch.metrics["credit/turn_reward_mean"] == pytest.approx(1.75 / 6)
    assert token_values(batch, 3) == []


def test_a_failed_episodes_turns_are_left_out_of_the_mean_turn_reward():
    # the second episode failed after two paid turns: its turns train nothing and are not averaged
    batch = batch_of(([0.0, 1.0], False), ([4.0, 8.0], True), ([0.5], False))
    turn_credit(ctx(), credit="mc")(batch)
    assert batch.metrics["credit/turns_mean"] == 1.5
    assert batch.metrics["credit/turn_reward_mean"] == pytest.approx(1.5 / 3)
    assert token_values(batch, 1) == [0.0] * 5


def test_a_batch_with_no_kept_episode_and_no_turn_has_zero_metrics():
    batch = batch_of(([], True), ([], True))
    turn_credit(ctx(), credit="mc")(batch)
    assert batch.metrics["credit/turns_mean"] == 0.0 and batch.metrics["credit/turn_reward_mean"] == 0.0
    assert not batch.advantages.any()


def test_grpo_needs_groups_and_the_group_size_defaults_to_two():
    batch = batch_of(([1.0], False), ([0.0], False))
    batch.group_ids = torch.tensor([0, 0])
    stage = turn_credit(ctx(), credit="grpo")  # no rollout.group_size: 2, GRPO's group
    stage(batch)
    a, b = token_values(batch, 0), token_values(batch, 1)
    assert a[0] > 0 > b[0] and a[0] == pytest.approx(-b[0])
    assert stage.state_dict() == {} and stage.load_state_dict({}) is None
    with pytest.raises(ConfigError, match=r"^config key 'rollout.group_size' must be >= 2 with credit: grpo "
                                          r"\(the group baseline\)$"):
        turn_credit(ctx(group_size=1), credit="grpo")
    with pytest.raises(ConfigError, match=r"^config key 'stages.advantage_kwargs.credit' = 'gae' is out of range: "
                                          r"expected mc_rebn, mc, grpo or ipa$"):
        turn_credit(ctx(), credit="gae")
