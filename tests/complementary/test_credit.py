"""The extractor's paired reward, the conditional grouping and an entry's with-minus-without help, against naive
references written differently."""

from __future__ import annotations

import random

import pytest
import torch

from credo import algos
from credo.families.complementary.credit import conditional_group_ids, paired_gain, with_minus_without


@pytest.mark.parametrize("seed", range(4))
def test_paired_gain_is_the_mean_over_valid_pairs(seed):
    g = torch.Generator().manual_seed(seed)
    C, M = 5, 7
    with_r = torch.randint(0, 2, (C, M), generator=g).float() - 0.1 * torch.randint(0, 2, (C, M), generator=g)
    base = torch.randint(0, 2, (M,), generator=g).float()
    valid = torch.rand(C, M, generator=g) > 0.3
    valid[0] = False  # a candidate with no valid pair gets 0
    got = paired_gain(with_r, base, valid)
    for c in range(C):
        diffs = [float(with_r[c, m]) - float(base[m]) for m in range(M) if valid[c, m]]
        want = sum(diffs) / len(diffs) if diffs else 0.0
        assert abs(float(got[c]) - want) < 1e-6
    # every pair valid: the mean with the candidate minus the mean of the baseline arm
    assert torch.allclose(paired_gain(with_r, base), with_r.mean(-1) - base.mean(), atol=1e-6)


def test_paired_gain_of_a_lesson_that_opens_every_vault():
    base = torch.tensor([0.0, 1.0, 0.0, 0.0])  # one of four opened without a lesson
    assert paired_gain(torch.ones(1, 4), base).tolist() == [0.75]
    assert paired_gain(base[None], base).tolist() == [0.0]  # the same context as the baseline: no gain


def partition(ids: list) -> set:
    """The partition of indices that `ids` induces, as a set of frozensets."""
    blocks: dict = {}
    for i, x in enumerate(ids):
        blocks.setdefault(x, set()).add(i)
    return {frozenset(b) for b in blocks.values()}


@pytest.mark.parametrize("seed", range(5))
def test_conditional_groups_are_the_game_and_context_partition(seed):
    rng = random.Random(seed)
    G = 6
    games = [j for j in rng.sample(range(50), 5) for _ in range(G)]
    contexts = [rng.choice([None, (0, 1), (0, 2), (3, 1)]) for _ in games]
    ids = conditional_group_ids(games, contexts, G).tolist()
    want = partition([(g, c) for g, c in zip(games, contexts)])
    assert partition(ids) == want
    # the ids of different ranks (disjoint games) never collide: each id lies in its game's block of G
    assert all(g * G <= i < (g + 1) * G for g, i in zip(games, ids))


def test_conditional_grpo_normalises_within_the_shown_context():
    """GRPO over the conditional ids equals GRPO run separately on each (game, context) subset."""
    G = 4
    games = [0] * G + [1] * G
    contexts = [(0, 1), (0, 1), None, None, None, None, None, None]
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    mask = torch.ones(8, 3)
    adv = algos.grpo(rewards, conditional_group_ids(games, contexts, G), mask)[:, 0]
    for idx in ([0, 1], [2, 3], [4, 5, 6, 7]):
        r = rewards[idx]
        std = r.std() if len(idx) > 1 else torch.tensor(0.0)
        want = (r - r.mean()) / (std + 1e-6)
        assert torch.allclose(adv[idx], want, atol=1e-5)
    # per-game groups would have mixed the lesson's two successes into game 0's baseline
    per_game = algos.grpo(rewards, torch.tensor(games), mask)[:, 0]
    assert not torch.allclose(per_game[:4], adv[:4])


def test_with_minus_without_per_game():
    returns = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 5.0]
    games = [0, 0, 0, 0, 1, 1, 1]
    shown = [True, True, False, False, True, True, False]
    valid = [True, True, True, True, True, True, False]  # game 1 has no valid episode without the lesson
    assert with_minus_without(returns, games, shown, valid) == {0: 0.5 - 0.5}
    assert with_minus_without([1.0, 0.0], [3, 3], [True, False], [True, True]) == {3: 1.0}
