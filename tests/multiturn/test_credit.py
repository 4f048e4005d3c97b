"""GEM's per-turn Monte-Carlo returns and ReBN against naive loops."""

import random

import pytest
import torch

from credo.config import ConfigError
from credo.credit import return_batch_norm, turn_returns
from credo.train.turn_credit import turn_credit
from tests.multiturn.common import ctx


def naive_returns(rewards, gamma):
    out, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_turn_returns_and_rebn_match_naive_loops(gamma):
    rng = random.Random(int(gamma * 10))
    episodes = [[rng.choice([0.0, 0.0, 1.0, -0.1, 0.25]) for _ in range(rng.randint(0, 5))] for _ in range(9)]
    keep = [rng.random() > 0.2 for _ in episodes]
    K = 5
    rewards = torch.tensor([e + [7.0] * (K - len(e)) for e in episodes])  # padding must be ignored
    counts = torch.tensor([len(e) for e in episodes])
    got = turn_returns(rewards, counts, gamma)
    flat = []
    for b, e in enumerate(episodes):
        want = naive_returns(e, gamma)
        assert torch.allclose(got[b, :len(e)], torch.tensor(want)) and (got[b, len(e):] == 0).all()
        if keep[b]:
            flat += want
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / len(flat)) ** 0.5  # population std, as GEM's Oat learner
    valid = (torch.arange(K)[None, :] < counts[:, None]) & torch.tensor(keep)[:, None]
    norm = return_batch_norm(got, valid)
    for b, e in enumerate(episodes):
        for k in range(K):
            want = (naive_returns(e, gamma)[k] - mean) / (std + 1e-9) if keep[b] and k < len(e) else 0.0
            assert abs(float(norm[b, k]) - want) < 1e-5


def test_rebn_of_nothing_is_zero_and_shapes_are_checked():
    assert (return_batch_norm(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)) == 0).all()
    with pytest.raises(ValueError, match=r"num_turns has shape \[3\], expected \[2\]"):
        turn_returns(torch.zeros(2, 4), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"valid has shape \[2, 2\], expected \[2, 3\] like returns"):
        return_batch_norm(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool))


def test_credit_choice_is_checked():
    with pytest.raises(ConfigError, match="stages.advantage_kwargs.credit' = 'gae': expected one of mc_rebn, mc, grpo, ipa"):
        turn_credit(ctx(group_size=2), credit="gae")
    with pytest.raises(ConfigError, match="rollout.group_size' must be >= 2 with credit: grpo"):
        turn_credit(ctx(group_size=1), credit="grpo")
