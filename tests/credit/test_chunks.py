"""Chunk credit of IPA (arXiv 2512.24873): hand-worked chunk ids, returns, ratios and masks."""

from __future__ import annotations

import math

import pytest
import torch

from credo.credit.chunks import (
    chunk_ids,
    chunk_mean,
    chunk_mismatch_mask,
    chunk_ratio,
    chunk_returns,
    chunk_returns_from_rewards,
    num_chunks,
)

# Row 0: one chunk filling the row.
# Row 1: observation, chunk, obs, obs, chunk, obs, chunk of 2, trailing obs -> 3 chunks.
# Row 2: no response at all -> 0 chunks.
# Row 3: leading observations, one chunk, trailing observations.
MASK = torch.tensor(
    [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 0, 0, 1, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0, 0, 0],
    ],
    dtype=torch.bool,
)
IDS = torch.tensor(
    [
        [0, 0, 0, 0, 0, 0, 0, 0, 0],
        [-1, 0, -1, -1, 1, -1, 2, 2, -1],
        [-1, -1, -1, -1, -1, -1, -1, -1, -1],
        [-1, -1, 0, 0, 0, -1, -1, -1, -1],
    ]
)


def test_chunk_ids_on_one_three_and_zero_chunks():
    assert torch.equal(chunk_ids(MASK), IDS)
    assert torch.equal(chunk_ids(MASK.long()), IDS)  # 0/1 ints work too
    assert num_chunks(IDS).tolist() == [1, 3, 0, 1]


def test_chunk_returns_hand_worked():
    rewards = torch.tensor([2.0, 1.0, 5.0, -1.0])
    # gamma = 1: every response token carries R, observation tokens 0.
    expected_1 = torch.where(MASK, rewards[:, None].expand(4, 9), torch.zeros(4, 9))
    torch.testing.assert_close(chunk_returns(rewards, IDS, 1.0), expected_1)
    # gamma = 0.9, row 1 has K = 3: chunk 0 -> 0.9^2 * 1 = 0.81, chunk 1 -> 0.9, chunk 2 -> 1.
    # Single-chunk rows get the undiscounted reward (K - 1 - k = 0).
    out = chunk_returns(rewards, IDS, 0.9)
    torch.testing.assert_close(out[1], torch.tensor([0, 0.81, 0, 0, 0.9, 0, 1, 1, 0]))
    torch.testing.assert_close(out[0], torch.full((9,), 2.0))
    torch.testing.assert_close(out[2], torch.zeros(9))
    torch.testing.assert_close(out[3], torch.tensor([0, 0, -1.0, -1, -1, 0, 0, 0, 0]))


def test_chunk_returns_from_rewards_accumulates_backwards():
    # Row 1: rewards r = (1, 0, 2), gamma 0.5: G_2 = 2, G_1 = 0 + 0.5 * 2 = 1, G_0 = 1 + 0.5 = 1.5.
    # Row 0 has one chunk: G_0 = r_0 = 3; entries beyond K_b (the 7s) are ignored.
    chunk_rewards = torch.tensor([[3.0, 7.0, 7.0], [1.0, 0.0, 2.0], [7.0, 7.0, 7.0], [4.0, 7.0, 7.0]])
    out = chunk_returns_from_rewards(chunk_rewards, IDS, 0.5)
    torch.testing.assert_close(out[1], torch.tensor([0, 1.5, 0, 0, 1, 0, 2, 2, 0]))
    torch.testing.assert_close(out[0], torch.full((9,), 3.0))
    torch.testing.assert_close(out[2], torch.zeros(9))
    # With the reward on the last chunk only, it equals chunk_returns.
    last_only = torch.zeros(4, 3)
    final = torch.tensor([2.0, 1.0, 5.0, -1.0])
    for b, k in enumerate(num_chunks(IDS).tolist()):
        if k:
            last_only[b, k - 1] = final[b]
    torch.testing.assert_close(chunk_returns_from_rewards(last_only, IDS, 0.9), chunk_returns(final, IDS, 0.9))


def test_chunk_returns_from_rewards_accepts_integer_rewards():
    # Row 1: integer rewards (1, 0, 3), gamma 0.5: G_2 = 3, G_1 = 1.5, G_0 = 1 + 0.75 = 1.75 (not truncated).
    chunk_rewards = torch.tensor([[3, 0, 0], [1, 0, 3], [0, 0, 0], [4, 0, 0]])
    out = chunk_returns_from_rewards(chunk_rewards, IDS, 0.5)
    assert out.is_floating_point()
    torch.testing.assert_close(out[1], torch.tensor([0, 1.75, 0, 0, 1.5, 0, 3, 3, 0]))


def test_chunk_returns_from_rewards_rejects_too_few_columns():
    with pytest.raises(ValueError, match="chunk_rewards has 2 columns but a sample has 3 chunks"):
        chunk_returns_from_rewards(torch.zeros(4, 2), IDS, 1.0)


def test_chunk_ratio_is_geometric_mean_of_token_ratios():
    g = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(4, 9, generator=g, dtype=torch.float64)
    old = -torch.rand(4, 9, generator=g, dtype=torch.float64)
    ratio = chunk_ratio(log_probs, old, IDS)
    for b in range(4):
        for k in range(int(num_chunks(IDS)[b])):
            tokens = [t for t in range(9) if IDS[b, t] == k]
            product = 1.0
            for t in tokens:
                product *= math.exp(float(log_probs[b, t] - old[b, t]))
            for t in tokens:
                assert float(ratio[b, t]) == pytest.approx(product ** (1 / len(tokens)), rel=1e-12)
    assert bool((ratio[~MASK] == 1).all())  # 1 outside the response


def test_chunk_ratio_is_finite_under_extreme_ratios_and_ignores_nan_outside():
    log_probs = torch.full((4, 9), 0.0, requires_grad=True)
    old = torch.where(torch.arange(9) % 2 == 0, -30.0, 30.0).expand(4, 9).clone()  # e^+-30 per token
    old[~MASK] = float("nan")  # garbage at observation tokens must not leak
    ratio = chunk_ratio(log_probs, old, IDS)
    assert torch.isfinite(ratio).all()
    # Row 1 chunk 1 is the single token t=4 with log-ratio +30: the clamp gives e^20.
    assert float(ratio[1, 4].detach()) == pytest.approx(math.exp(20.0))
    ratio.sum().backward()
    assert torch.isfinite(log_probs.grad).all()


def test_chunk_mean_means_and_counts():
    values = torch.arange(36, dtype=torch.float64).reshape(4, 9)
    means, counts = chunk_mean(values, IDS)
    # Row 1: chunks {1}, {4}, {6, 7} of values 10, 13, (15 + 16) / 2.
    torch.testing.assert_close(means[1], torch.tensor([10.0, 13.0, 15.5], dtype=torch.float64))
    torch.testing.assert_close(counts[1], torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(counts[2], torch.zeros(3, dtype=torch.float64))


def test_chunk_mismatch_mask_drops_whole_chunks_outside_the_band():
    # Row 1 chunks: t=1 log-ratio old - rollout = log 1.5 (ratio 1.5, above 1.2 -> dropped);
    # t=4 log-ratio 0 (kept); t=6,7 log-ratios log 1.1 and log 0.8: geometric ratio
    # sqrt(1.1 * 0.8) = 0.938 (kept with ratio band 0.9..1.2; dropped with 0.95..1.2).
    old = torch.full((4, 9), -1.0, dtype=torch.float64)
    rollout = old.clone()
    rollout[1, 1] = -1.0 - math.log(1.5)
    rollout[1, 6] = -1.0 - math.log(1.1)
    rollout[1, 7] = -1.0 - math.log(0.8)
    keep = chunk_mismatch_mask(old, rollout, IDS, 0.9, 1.2)
    assert keep[1].tolist() == [False, False, False, False, True, False, True, True, False]
    assert torch.equal(keep[0], torch.ones(9, dtype=torch.bool))
    assert not keep[2].any()
    keep = chunk_mismatch_mask(old, rollout, IDS, 0.95, 1.2)
    assert keep[1].tolist() == [False, False, False, False, True, False, False, False, False]
    # One-sided (the paper's "<= H"): no lower bound keeps the 0.938 chunk, H = 1.6 keeps t=1 too.
    keep = chunk_mismatch_mask(old, rollout, IDS, None, 1.6)
    assert keep[1].tolist() == [False, True, False, False, True, False, True, True, False]


def test_chunk_mismatch_mask_band_is_inclusive():
    # Single-token chunks with log-ratios exactly log 0.8, 0 and log 1.25 sit on or inside the band
    # ratio_low <= ratio <= ratio_high and are kept; log 1.3 is beyond it.
    ids = torch.tensor([[0, -1, 1, 2, 3]])
    old = torch.tensor([[math.log(0.8), 7.0, 0.0, math.log(1.25), math.log(1.3)]], dtype=torch.float64)
    keep = chunk_mismatch_mask(old, torch.zeros_like(old), ids, 0.8, 1.25)
    assert keep.tolist() == [[True, False, True, True, False]]


def test_chunk_mean_of_an_empty_batch_has_no_chunk_slots():
    # K defaults to the largest chunk count, which an empty batch does not have: [0, 0]
    means, counts = chunk_mean(torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.long))
    assert means.shape == (0, 0) and counts.shape == (0, 0)


def test_chunk_mismatch_mask_probability_difference_band():
    # Row 3 chunk (t=2..4): pi_old = e^-1 = 0.3679 each; rollout probs 0.2679, 0.3679, 0.3679:
    # mean difference = 0.1 / 3 = 0.0333. Band [-0.02, 0.02] drops it, [-0.05, 0.05] keeps it.
    old = torch.full((4, 9), -1.0, dtype=torch.float64)
    rollout = old.clone()
    rollout[3, 2] = math.log(math.exp(-1.0) - 0.1)
    ratio_band = dict(ratio_low=0.0, ratio_high=10.0)
    tight = chunk_mismatch_mask(old, rollout, IDS, **ratio_band, diff_low=-0.02, diff_high=0.02)
    loose = chunk_mismatch_mask(old, rollout, IDS, **ratio_band, diff_low=-0.05, diff_high=0.05)
    assert not tight[3].any() and tight[0].all()
    assert loose[3].tolist() == [False, False, True, True, True, False, False, False, False]


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"old_log_probs has shape \[4, 8\], expected \[4, 9\] like log_probs"):
        chunk_ratio(torch.zeros(4, 9), torch.zeros(4, 8), IDS)
    with pytest.raises(ValueError, match="final_rewards"):
        chunk_returns(torch.zeros(3), IDS)


def test_two_dimensional_arguments_are_named_when_they_are_not():
    from credo.algos.chunks import chunk_to_tokens

    with pytest.raises(ValueError, match=r"^chunk_rewards has shape \[3\], expected \[B, T\]$"):
        chunk_returns_from_rewards(torch.zeros(3), IDS)
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[9\], expected \[B, T\]$"):
        chunk_to_tokens(torch.zeros(4, 3), IDS[0], 0.0)
    with pytest.raises(ValueError, match=r"^ratio_low=-0.5, expected a non-negative ratio bound or None$"):
        chunk_mismatch_mask(torch.zeros(4, 9), torch.zeros(4, 9), IDS, ratio_low=-0.5)
    with pytest.raises(ValueError, match=r"^ratio_high=-2, expected a non-negative ratio bound or None$"):
        chunk_mismatch_mask(torch.zeros(4, 9), torch.zeros(4, 9), IDS, ratio_high=-2)
