"""The turn_credit stage on a packed batch against naive loops: GEM's per-turn MC returns + ReBN, IPA returns."""

import random

import pytest
import torch

from credo.config import ConfigError
from credo.distributed.rollout import Sample
from credo.train.batch import Batch, pack_batch
from credo.families.multiturn.source import EnvReward
from credo.families.multiturn.turn_credit import turn_credit
from tests.multiturn.common import ctx


def naive_returns(rewards, gamma):
    out, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


def random_batch(rng, n=7):
    """Episodes of 1-4 turns (1-3 tokens each) separated by 1-2 observation tokens; some failed."""
    samples, episodes = [], []
    for _ in range(n):
        rewards = [rng.choice([0.0, 0.0, 1.0, -0.1, 0.25]) for _ in range(rng.randint(1, 4))]
        ids, mask, turn_of = [], [], []
        for k in range(len(rewards)):
            if k:
                m = rng.randint(1, 2)
                ids += [9] * m
                mask += [0] * m
                turn_of += [None] * m
            m = rng.randint(1, 3)
            ids += [5] * m
            mask += [1] * m
            turn_of += [k] * m
        failed = rng.random() < 0.2
        meta = {"turn_rewards": rewards, "failed": failed}
        samples.append(Sample([1, 2], ids, mask, [0.0] * len(ids), True, 0, meta))
        episodes.append((rewards, turn_of, failed))
    batch = Batch(samples=samples, problems=[None] * n, group_ids=torch.arange(n))
    EnvReward()(batch)
    pack_batch(batch, 0, overlong_filter=False)
    return batch, episodes


@pytest.mark.parametrize("credit,gamma", [("mc_rebn", 1.0), ("mc_rebn", 0.9), ("mc", 0.5), ("ipa", 0.9)])
def test_turn_credit_matches_naive_loops(credit, gamma):
    rng = random.Random(f"{credit}{gamma}")
    batch, episodes = random_batch(rng)
    turn_credit(ctx(group_size=1), credit=credit, gamma=gamma)(batch)
    flat = [g for rewards, _, failed in episodes if not failed for g in naive_returns(rewards, gamma)]
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / len(flat)) ** 0.5  # population std, GEM's Oat learner
    for b, (rewards, turn_of, failed) in enumerate(episodes):
        G = naive_returns(rewards, gamma)
        row = batch.advantages[b, 1:1 + len(turn_of)]  # label-aligned: response token j is column p - 1 + j
        for j, k in enumerate(turn_of):
            if k is None or failed:
                want = 0.0
            elif credit == "mc_rebn":
                want = (G[k] - mean) / (std + 1e-9)
            else:
                want = G[k]
            assert abs(float(row[j]) - want) < 1e-5, (b, j)
        assert (batch.advantages[b, 1 + len(turn_of):] == 0).all()


def test_a_turn_count_that_disagrees_with_the_mask_is_an_error():
    batch, _ = random_batch(random.Random(0), n=3)
    batch.valid[:] = True
    batch.samples[0].meta["turn_rewards"] = batch.samples[0].meta["turn_rewards"] + [0.0]
    with pytest.raises(ValueError, match="sample 0: the rollout recorded .* turns but the response mask has"):
        turn_credit(ctx(group_size=1), credit="mc_rebn")(batch)


def test_credit_choice_is_checked():
    with pytest.raises(ConfigError, match="stages.advantage_kwargs.credit' = 'gae' is out of range: expected mc_rebn, "
                                          "mc, grpo or ipa"):
        turn_credit(ctx(group_size=2), credit="gae")
    with pytest.raises(ConfigError, match="rollout.group_size' must be >= 2 with credit: grpo"):
        turn_credit(ctx(group_size=1), credit="grpo")
