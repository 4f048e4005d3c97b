"""Boundaries of the shared selection helpers (credo.credit._select) and of the chunk returns.

Every expected value is worked by hand in the comments (or from a plain Python loop written for the test).
"""

from __future__ import annotations

import math

import pytest
import torch

from credo.credit._select import SIGN_MODES, apply_sign_mode, response_rows, top_fraction_mask
from credo.credit.chunks import chunk_ids, chunk_returns, chunk_returns_from_rewards


def _naive_top(scores, valid, fraction, largest=True):
    """A plain-Python top fraction: sort valid (value, position) pairs, NaN last, ties by position."""
    picked = []
    n = sum(valid)
    if n == 0 or fraction == 0:
        count = 0
    else:
        count = min(n, max(1, math.floor(fraction * n + 0.5 + 1e-9)))

    def key(i):
        v = scores[i]
        if math.isnan(v):
            return (1, 0.0, i)
        return (0, -v if largest else v, i)

    order = sorted((i for i in range(len(scores)) if valid[i]), key=key)
    picked = set(order[:count])
    return [i in picked for i in range(len(scores))]


# --- top_fraction_mask ---------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [-0.01, 1.01, float("nan")])
def test_top_fraction_mask_rejects_a_fraction_outside_zero_one(fraction):
    with pytest.raises(ValueError, match=rf"^fraction={fraction}, expected a value in \[0, 1\]$"):
        top_fraction_mask(torch.zeros(3), torch.ones(3, dtype=torch.bool), fraction)


def test_top_fraction_mask_accepts_the_bounds_zero_and_one():
    scores = torch.tensor([3.0, 1.0, 2.0])
    valid = torch.tensor([True, True, False])
    assert top_fraction_mask(scores, valid, 0.0).tolist() == [False, False, False]
    # fraction 1 selects every valid entry and never an invalid one
    assert top_fraction_mask(scores, valid, 1.0).tolist() == [True, True, False]


@pytest.mark.parametrize(
    "fraction, n, count",
    [
        (0.5, 5, 3),  # 2.5 rounds half up to 3
        (0.3, 5, 2),  # 1.5 -> 2
        (0.1, 5, 1),  # 0.5 -> 1
        (0.29, 5, 1),  # 1.45 -> 1
        (0.05, 5, 1),  # 0.25 -> 0, but at least 1
        (0.7, 5, 4),  # 3.5 -> 4
        (0.4, 8, 3),  # 3.2 -> 3
        (0.99, 1, 1),
    ],
)
def test_top_fraction_mask_counts_the_nearest_integer_halves_up(fraction, n, count):
    scores = torch.arange(n, dtype=torch.float32)  # largest at the end
    out = top_fraction_mask(scores, torch.ones(n, dtype=torch.bool), fraction)
    assert out.dtype == torch.bool and out.shape == (n,)
    assert out.tolist() == [i >= n - count for i in range(n)]


def test_top_fraction_mask_largest_default_and_smallest():
    scores = torch.tensor([0.5, -2.0, 4.0, 1.0, 3.0])
    valid = torch.ones(5, dtype=torch.bool)
    # 0.4 * 5 = 2: the two largest are 4.0 (2) and 3.0 (4); the two smallest -2.0 (1) and 0.5 (0)
    assert top_fraction_mask(scores, valid, 0.4).tolist() == [False, False, True, False, True]
    assert top_fraction_mask(scores, valid, 0.4, largest=True).tolist() == [False, False, True, False, True]
    assert top_fraction_mask(scores, valid, 0.4, largest=False).tolist() == [True, True, False, False, False]


def test_top_fraction_mask_breaks_ties_by_position_and_ranks_nan_last():
    # all equal: the earliest entries win, whichever direction
    ties = torch.zeros(6)
    valid = torch.ones(6, dtype=torch.bool)
    assert top_fraction_mask(ties, valid, 0.5).tolist() == [True, True, True, False, False, False]
    assert top_fraction_mask(ties, valid, 0.5, largest=False).tolist() == [True, True, True, False, False, False]
    # NaN ranks below every number, for the largest and for the smallest
    scores = torch.tensor([float("nan"), -5.0, float("nan"), 7.0])
    assert top_fraction_mask(scores, torch.ones(4, dtype=torch.bool), 0.5).tolist() == [False, True, False, True]
    assert top_fraction_mask(scores, torch.ones(4, dtype=torch.bool), 0.5, largest=False).tolist() == [
        False, True, False, True]
    # with every entry selected, the NaN entries are selected too (they are valid)
    assert top_fraction_mask(scores, torch.ones(4, dtype=torch.bool), 1.0).tolist() == [True] * 4


def test_top_fraction_mask_never_selects_invalid_entries_and_counts_only_valid_ones():
    # invalid entries hold the largest scores; 4 valid entries, 0.5 -> 2 of them
    scores = torch.tensor([100.0, 1.0, 100.0, 3.0, 2.0, 100.0, 0.0])
    valid = torch.tensor([False, True, False, True, True, False, True])
    assert top_fraction_mask(scores, valid, 0.5).tolist() == [False, False, False, True, True, False, False]
    assert top_fraction_mask(scores, valid, 0.5, largest=False).tolist() == [
        False, True, False, False, False, False, True]
    # an invalid -inf never displaces a valid -inf
    scores = torch.tensor([-math.inf, -math.inf, -math.inf])
    valid = torch.tensor([False, True, True])
    assert top_fraction_mask(scores, valid, 0.5).tolist() == [False, True, False]


def test_top_fraction_mask_empty_rows_and_rows_of_one():
    scores = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5.0, 2.0, 3.0]])
    valid = torch.tensor([[False, False, False], [False, True, False], [True, True, True]])
    out = top_fraction_mask(scores, valid, 0.2)
    # row 0: nothing valid -> nothing; row 1: one valid entry, 0.2 -> at least 1; row 2: 0.6 -> 1
    assert out.tolist() == [[False, False, False], [False, True, False], [True, False, False]]
    # a last dimension of size 0
    empty = top_fraction_mask(torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool), 0.5)
    assert empty.shape == (2, 0) and empty.dtype == torch.bool


def test_top_fraction_mask_matches_a_naive_sort_on_random_rows():
    g = torch.Generator().manual_seed(5)
    scores = torch.randint(0, 4, (6, 11), generator=g).float()  # many ties
    scores[torch.rand(6, 11, generator=g) < 0.15] = float("nan")
    valid = torch.rand(6, 11, generator=g) < 0.7
    for fraction in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
        for largest in (True, False):
            out = top_fraction_mask(scores, valid, fraction, largest=largest)
            for b in range(6):
                want = _naive_top(scores[b].tolist(), valid[b].tolist(), fraction, largest)
                assert out[b].tolist() == want, (fraction, largest, b)


# --- apply_sign_mode / response_rows -------------------------------------------------------------


def test_sign_modes_are_the_three_names():
    assert SIGN_MODES == ("both", "positive", "negative")


def test_apply_sign_mode_keeps_zero_advantages_as_positive():
    gamma = torch.tensor([2.0, 3.0, 4.0, 5.0])
    adv = torch.tensor([1.0, 0.0, -0.0, -1e-9])
    # "positive" keeps advantages >= 0 (0 and -0 included), "negative" keeps < 0 only
    assert apply_sign_mode(gamma, adv, "positive").tolist() == [2.0, 3.0, 4.0, 1.0]
    assert apply_sign_mode(gamma, adv, "negative").tolist() == [1.0, 1.0, 1.0, 5.0]
    # "both" returns the multipliers as they are, advantages or not
    assert apply_sign_mode(gamma, None, "both") is gamma
    assert apply_sign_mode(gamma, adv, "both") is gamma


def test_apply_sign_mode_broadcasts_advantages_and_detaches_them():
    gamma = torch.tensor([[2.0, 3.0], [4.0, 5.0]])
    adv = torch.tensor([1.0, -1.0], requires_grad=True)  # [N] against [B, N]
    out = apply_sign_mode(gamma, adv, "positive")
    assert out.tolist() == [[2.0, 1.0], [4.0, 1.0]] and not out.requires_grad
    out = apply_sign_mode(gamma, adv[:, None], "negative")  # [B, 1]: one sign per row
    assert out.tolist() == [[1.0, 1.0], [4.0, 5.0]]


def test_apply_sign_mode_names_a_bad_mode_missing_or_misshapen_advantages():
    gamma = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"^sign_mode='Positive', expected one of \('both', 'positive', 'negative'\)$"):
        apply_sign_mode(gamma, torch.ones(2, 3), "Positive")
    with pytest.raises(ValueError, match=r"^sign_mode='negative' needs advantages, got None$"):
        apply_sign_mode(gamma, None, "negative")
    with pytest.raises(ValueError, match=r"^advantages has shape \[2, 2\], expected \[2, 3\] like the per-token scores$"):
        apply_sign_mode(gamma, torch.ones(2, 2), "positive")


def test_response_rows_defaults_to_all_tokens_and_checks_the_shape():
    rows = response_rows(None, torch.Size([2, 3]), "cpu")
    assert rows.dtype == torch.bool and rows.shape == (2, 3) and bool(rows.all())
    mask = torch.tensor([[1, 0, 2], [0, 0, 1]])
    out = response_rows(mask, torch.Size([2, 3]), "cpu")
    assert out.dtype == torch.bool and out.tolist() == [[True, False, True], [False, False, True]]
    with pytest.raises(ValueError, match=r"^response_mask has shape \[3\], expected \[2, 3\]$"):
        response_rows(torch.ones(3), torch.Size([2, 3]), "cpu")


# --- chunk returns -------------------------------------------------------------------------------

# row 0: chunks 0 (cols 0-1), 1 (col 3), 2 (col 5); row 1: one chunk (cols 2-4); row 2: no chunk
MASK = torch.tensor([[1, 1, 0, 1, 0, 1], [0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)


def test_chunk_returns_default_gamma_is_one_and_integer_rewards_become_float():
    ids = chunk_ids(MASK)
    out = chunk_returns(torch.tensor([3, -2, 7]), ids)
    assert out.dtype == torch.float32
    assert out.tolist() == [[3, 3, 0, 3, 0, 3], [0, 0, -2, -2, -2, 0], [0] * 6]
    # float64 rewards keep their dtype
    assert chunk_returns(torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64), ids).dtype == torch.float64


def test_chunk_returns_discounts_by_chunks_after_and_gamma_zero():
    ids = chunk_ids(MASK)
    out = chunk_returns(torch.tensor([2.0, 5.0, 1.0]), ids, gamma=0.5)
    # row 0 (K=3): chunk 0 -> 0.25 * 2, chunk 1 -> 0.5 * 2, chunk 2 -> 2; row 1 (K=1): 5
    assert out.tolist() == [[0.5, 0.5, 0, 1.0, 0, 2.0], [0, 0, 5, 5, 5, 0], [0] * 6]
    # gamma = 0: only the last chunk gets the reward (0 ** 0 = 1)
    out = chunk_returns(torch.tensor([2.0, 5.0, 1.0]), ids, gamma=0.0)
    assert out.tolist() == [[0, 0, 0, 0, 0, 2.0], [0, 0, 5, 5, 5, 0], [0] * 6]


def test_chunk_returns_names_the_expected_reward_shape():
    ids = chunk_ids(MASK)
    with pytest.raises(ValueError, match=r"^final_rewards has shape \[3, 1\], expected \[3\] \(one reward per row of chunk_ids\)$"):
        chunk_returns(torch.zeros(3, 1), ids)
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[6\], expected \[B, T\]$"):
        chunk_returns(torch.zeros(1), ids[0])


def test_chunk_returns_from_rewards_hand_worked_with_extra_columns_ignored():
    ids = chunk_ids(MASK)
    rewards = torch.tensor([[1.0, 2.0, 4.0, 100.0], [3.0, 100.0, 100.0, 100.0], [100.0] * 4])
    out = chunk_returns_from_rewards(rewards, ids, gamma=0.5)
    # row 0: G2 = 4, G1 = 2 + 0.5 * 4 = 4, G0 = 1 + 0.5 * 4 = 3 (column 3 is not a chunk of row 0)
    # row 1: G0 = 3 (columns 1.. ignored); row 2 has no chunk
    assert out.tolist() == [[3, 3, 0, 4, 0, 4], [0, 0, 3, 3, 3, 0], [0] * 6]
    # default gamma 1: plain sums of the rewards from each chunk on
    out = chunk_returns_from_rewards(rewards, ids)
    assert out.tolist() == [[7, 7, 0, 6, 0, 4], [0, 0, 3, 3, 3, 0], [0] * 6]


def test_chunk_returns_from_rewards_integer_rewards_and_exact_column_count():
    ids = chunk_ids(MASK)
    out = chunk_returns_from_rewards(torch.tensor([[1, 1, 1], [2, 0, 0], [0, 0, 0]]), ids, gamma=1.0)
    assert out.dtype == torch.float32
    assert out.tolist() == [[3, 3, 0, 2, 0, 1], [0, 0, 2, 2, 2, 0], [0] * 6]
    # float64 rewards keep their dtype (and their precision: 1 + 1e-12 is not a float32)
    out = chunk_returns_from_rewards(torch.tensor([[1.0, 1e-12, 0.0], [0.0] * 3, [0.0] * 3], dtype=torch.float64), ids)
    assert out.dtype == torch.float64 and out[0, 0].item() == 1.0 + 1e-12


def test_chunk_returns_from_rewards_names_rows_and_columns():
    ids = chunk_ids(MASK)
    with pytest.raises(ValueError, match=r"^chunk_rewards has 2 columns but a sample has 3 chunks$"):
        chunk_returns_from_rewards(torch.zeros(3, 2), ids)
    with pytest.raises(ValueError, match=r"^chunk_rewards has shape \[2, 3\], expected \[3, K_max\] \(one row per row of chunk_ids\)$"):
        chunk_returns_from_rewards(torch.zeros(2, 3), ids)
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[6\], expected \[B, T\]$"):
        chunk_returns_from_rewards(torch.zeros(3, 3), ids[0])


def test_chunk_returns_from_rewards_of_an_empty_batch():
    out = chunk_returns_from_rewards(torch.zeros(0, 2), torch.zeros(0, 5, dtype=torch.long))
    assert out.shape == (0, 5)
