"""IPA's loss and its chunk primitives on hand-worked boundary inputs: the defaults of every keyword,
explicit chunk ids, advantages of 0 and between 0 and 1, ratios exactly 1, empty chunk slots, and
every metric. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos.chunks import chunk_ids, chunk_mean, chunk_mismatch_mask, chunk_ratio, chunk_to_tokens, num_chunks
from credo.credit.ipa import ipa_loss

F64 = torch.float64
E = math.exp


def _t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


# Three rows of four tokens (chunks by the mask):
#   row 0: mask [1, 1, 0, 1] -> chunk 0 = {0, 1}, chunk 1 = {3}; the masked-out token holds lp 9
#   row 1: mask [1, 1, 1, 0] -> chunk 0 = {0, 1, 2}
#   row 2: mask [1, 0, 1, 1] -> chunk 0 = {0}, chunk 1 = {2, 3}
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
LP = _t([[0.1, 0.3, 9.0, 0.0], [0.2, 0.2, 0.2, 5.0], [-0.3, 4.0, -0.6, -0.6]])
OLD = torch.zeros(3, 4, dtype=F64)
ADV = _t([[1.0, 1.0, 7.0, -1.0], [0.5, 0.0, -1.0, 3.0], [-1.0, -1.0, -1.0, -1.0]])
# train/infer log-ratio old - rollout: row 0 chunk 0 at log 1.25 (above the default 1.2: dropped),
# row 0 chunk 1 at log 0.85 (inside the default [0.8, 1.2]: kept), rows 1 and 2 at 0 (kept)
ROLLOUT = _t([[-math.log(1.25), -math.log(1.25), 0.0, -math.log(0.85)], [0.0] * 4, [0.0] * 4])
# chunk ratios rho_c: row 0: e^0.2 (mean of 0.1, 0.3), 1 (lp 0); row 1: e^0.2; row 2: e^-0.3, e^-0.6
# per-token loss -coef A lp, coef 1 where A > 0, clip(rho_c, 0, 1) where A <= 0:
#   row 0: t0, t1 dropped by the mismatch mask; t3: lp 0 -> 0
#   row 1: t0 (A = 0.5 > 0): -0.5 * 0.2 = -0.1; t1 (A = 0): 0; t2 (A = -1, coef 1): 0.2
#   row 2: t0: -e^-0.3 * -1 * -0.3 = -0.3 e^-0.3; t2, t3: -0.6 e^-0.6 each
LOSS_SUM = -0.1 + 0.2 - 0.3 * E(-0.3) - 1.2 * E(-0.6)


def test_hand_worked_loss_and_metrics_with_the_defaults():
    lp = LP.clone().requires_grad_()
    loss, metrics = ipa_loss(lp, OLD, ADV, MASK, rollout_log_probs=ROLLOUT)
    assert loss.item() == pytest.approx(LOSS_SUM / 9, rel=1e-12)  # token mean over the 9 masked tokens
    # d loss / d lp_t = -coef A / 9 on kept tokens, 0 on dropped and masked-out ones
    expected_grad = _t([[0.0, 0.0, 0.0, 1.0], [-0.5, 0.0, 1.0, 0.0], [E(-0.3), 0.0, E(-0.6), E(-0.6)]]) / 9
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], expected_grad)
    assert metrics["positive_frac"].item() == pytest.approx(3 / 9)  # row 0 t0, t1 and row 1 t0
    assert metrics["truncated_frac"].item() == pytest.approx(2 / 9)  # row 1 t1, t2 (A <= 0, rho e^0.2 > 1)
    assert metrics["chunk_masked_frac"].item() == pytest.approx(2 / 9)
    # 5 chunks hold a masked token (row 1's second slot is empty); 1 is dropped
    assert metrics["chunk_dropped_frac"].item() == pytest.approx(1 / 5)
    rhos = [E(0.2), E(0.2), 1.0, E(0.2), E(0.2), E(0.2), E(-0.3), E(-0.6), E(-0.6)]
    assert metrics["ratio_mean"].item() == pytest.approx(sum(rhos) / 9, rel=1e-12)  # the chunk ratio wins
    assert metrics["ratio_max"].item() == pytest.approx(E(0.2), rel=1e-12)
    assert metrics["ratio_min"].item() == pytest.approx(E(-0.6), rel=1e-12)
    assert "mismatch_kl_k1" in metrics  # the wrapper's correction metrics, with rollout_log_probs


def test_without_rollout_nothing_is_dropped():
    loss, metrics = ipa_loss(LP, OLD, ADV, MASK)
    # row 0 t0, t1 now count: A = 1 > 0: -0.1 and -0.3
    assert loss.item() == pytest.approx((LOSS_SUM - 0.4) / 9, rel=1e-12)
    assert metrics["chunk_masked_frac"].item() == 0.0
    assert metrics["chunk_dropped_frac"].item() == 0.0


def test_band_and_weights_are_passed_through():
    # ratio_high 1.3 keeps row 0 chunk 0; ratio_low 0.9 drops row 0 chunk 1 (0.85)
    loss, metrics = ipa_loss(LP, OLD, ADV, MASK, rollout_log_probs=ROLLOUT, ratio_low=0.9, ratio_high=1.3)
    assert loss.item() == pytest.approx((LOSS_SUM - 0.4) / 9, rel=1e-12)
    assert metrics["chunk_dropped_frac"].item() == pytest.approx(1 / 5)
    assert metrics["chunk_masked_frac"].item() == pytest.approx(1 / 9)
    # one-sided bands: None is unbounded
    _, metrics = ipa_loss(LP, OLD, ADV, MASK, rollout_log_probs=ROLLOUT, ratio_low=None, ratio_high=None)
    assert metrics["chunk_dropped_frac"].item() == 0.0
    # w_+ = 2 and w_- = 3 scale the positive and the negative tokens
    loss, _ = ipa_loss(LP, OLD, ADV, MASK, rollout_log_probs=ROLLOUT, positive_weight=2.0, negative_weight=3.0)
    assert loss.item() == pytest.approx((2 * -0.1 + 3 * (0.2 - 0.3 * E(-0.3) - 1.2 * E(-0.6))) / 9, rel=1e-12)


def test_probability_difference_band_is_passed_through():
    # one row, chunk 0 = {0}: pi_old - mu = e^-1 - (e^-1 - 0.1) = 0.1; chunk 1 = {2}: -0.1
    old = _t([[-1.0, 0.0, -1.0]])
    rollout = _t([[math.log(E(-1.0) - 0.1), 0.0, math.log(E(-1.0) + 0.1)]])
    mask = torch.tensor([[True, False, True]])
    adv = _t([[1.0, 0.0, 1.0]])
    lp = _t([[-2.0, 0.0, -4.0]])
    band = dict(rollout_log_probs=rollout, ratio_low=None, ratio_high=None, agg_mode="seq-mean-token-sum")
    loss, _ = ipa_loss(lp, old, adv, mask, **band)
    assert loss.item() == pytest.approx(6.0)
    loss, _ = ipa_loss(lp, old, adv, mask, diff_low=-0.05, **band)  # drops chunk 1
    assert loss.item() == pytest.approx(2.0)
    loss, _ = ipa_loss(lp, old, adv, mask, diff_high=0.05, **band)  # drops chunk 0
    assert loss.item() == pytest.approx(4.0)


def test_explicit_chunk_ids_are_used_and_masked_out_ids_ignored():
    # row 2 as a single chunk {0, 2, 3} (mean log-ratio -0.5); row 0's masked-out token is given chunk 0,
    # but only masked tokens count: chunk 0 stays {0, 1} with rho e^0.2
    ids = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    loss, metrics = ipa_loss(LP, OLD, ADV, MASK, chunk_ids=ids, rollout_log_probs=ROLLOUT)
    row2 = -E(-0.5) * 1.5  # sum over t of -rho A lp = e^-0.5 (-0.3 - 0.6 - 0.6)
    assert loss.item() == pytest.approx((-0.1 + 0.2 + row2) / 9, rel=1e-12)
    assert metrics["chunk_dropped_frac"].item() == pytest.approx(1 / 4)
    assert metrics["ratio_min"].item() == pytest.approx(E(-0.5), rel=1e-12)


def test_chunk_ids_errors_name_the_tensor():
    with pytest.raises(ValueError, match=r"^chunk_ids is -1 on a masked-in token, expected a chunk index >= 0$"):
        ipa_loss(LP, OLD, ADV, MASK, chunk_ids=torch.tensor([[0, 0, 0, 0], [0, 0, -1, 0], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[3, 3\], expected \[3, 4\] like log_probs$"):
        ipa_loss(LP, OLD, ADV, MASK, chunk_ids=torch.zeros(3, 3, dtype=torch.long))
    # -1 outside the mask is fine
    ipa_loss(LP, OLD, ADV, MASK, chunk_ids=torch.where(MASK, 0, -1))


def test_ratio_at_the_default_clamp_and_a_single_dropped_chunk():
    # one token, log-ratio 25 > 20: rho = e^20 (the default max_log_ratio); its chunk is dropped
    lp = _t([[25.0]])
    loss, metrics = ipa_loss(lp, torch.zeros(1, 1, dtype=F64), _t([[-1.0]]), torch.ones(1, 1, dtype=torch.bool),
                             rollout_log_probs=_t([[5.0]]))
    assert metrics["ratio_max"].item() == pytest.approx(E(20.0), rel=1e-12)
    assert metrics["chunk_dropped_frac"].item() == 1.0  # 1 of 1 chunk
    assert metrics["truncated_frac"].item() == 1.0
    assert loss.item() == 0.0
    _, metrics = ipa_loss(lp, torch.zeros(1, 1, dtype=F64), _t([[-1.0]]), torch.ones(1, 1, dtype=torch.bool),
                          max_log_ratio=2.0)
    assert metrics["ratio_max"].item() == pytest.approx(E(2.0), rel=1e-12)


# ---- chunk primitives -----------------------------------------------------------------------------------


def test_chunk_ids_start_at_the_first_token_and_take_float_masks():
    mask = _t([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    ids = chunk_ids(mask)
    assert ids.tolist() == [[0, -1, 1, 1], [-1, 0, 0, -1]] and ids.dtype == torch.long
    with pytest.raises(ValueError, match=r"^response_mask has shape \[4\], expected \[B, T\]$"):
        chunk_ids(mask[0])


def test_num_chunks_of_rows_without_a_chunk_is_zero():
    out = num_chunks(torch.tensor([[-1, -1], [0, 1]]))
    assert out.tolist() == [0, 2] and out.dtype == torch.long
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[2\], expected \[B, T\]$"):
        num_chunks(torch.tensor([0, 1]))


def test_chunk_mean_with_more_slots_than_chunks_and_nan_outside():
    values = _t([[1.0, float("nan"), 3.0, 5.0]])
    ids = torch.tensor([[0, -1, 1, 1]])
    means, counts = chunk_mean(values, ids, max_chunks=3)
    assert means.tolist() == [[1.0, 4.0, 0.0]] and counts.tolist() == [[1.0, 2.0, 0.0]]
    assert means.dtype == counts.dtype == F64
    means, counts = chunk_mean(values, ids)  # default K = 2
    assert means.tolist() == [[1.0, 4.0]]
    with pytest.raises(ValueError, match=r"^chunk_ids holds a chunk index >= max_chunks=1$"):
        chunk_mean(values, ids, max_chunks=1)
    with pytest.raises(ValueError, match=r"^values has shape \[4\], expected \[B, T\]$"):
        chunk_mean(values[0], ids)
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[1, 3\], expected \[1, 4\] like values$"):
        chunk_mean(values, ids[:, :3])


def test_chunk_to_tokens_fills_outside_and_handles_no_chunk_slots():
    per_chunk = _t([[10.0, 20.0]])
    out = chunk_to_tokens(per_chunk, torch.tensor([[1, -1, 0]]), fill=-7.0)
    assert out.tolist() == [[20.0, -7.0, 10.0]] and out.dtype == F64
    empty = chunk_to_tokens(torch.zeros(2, 0, dtype=F64), torch.full((2, 3), -1), fill=2.5)
    assert empty.tolist() == [[2.5] * 3] * 2 and empty.dtype == F64  # the dtype of per_chunk, not the default
    with pytest.raises(ValueError, match=r"^per_chunk has shape \[2\], expected \[B, T\]$"):
        chunk_to_tokens(per_chunk[0], torch.tensor([[0, 1]]), fill=0.0)


def test_chunk_ratio_default_clamp_and_one_outside():
    ids = torch.tensor([[0, 0, -1, 1]])
    lp = _t([[30.0, 20.0, 99.0, -0.5]])
    out = chunk_ratio(lp, torch.zeros(1, 4, dtype=F64), ids)
    assert out.tolist() == [[E(20.0), E(20.0), 1.0, E(-0.5)]]
    out = chunk_ratio(lp, torch.zeros(1, 4, dtype=F64), ids, max_log_ratio=0.25)
    assert out.tolist() == [[E(0.25), E(0.25), 1.0, E(-0.25)]]
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[1, 3\], expected \[1, 4\] like log_probs$"):
        chunk_ratio(lp, lp, ids[:, :3])


def test_mismatch_mask_defaults_zero_bounds_and_nan():
    # single-token chunks with log-ratios old - rollout: log 0.8 (on the default low), log 1.2 (on the
    # default high), log 0.79, log 1.21 (outside), NaN (dropped)
    lr = [math.log(0.8), math.log(1.2), math.log(0.79), math.log(1.21), float("nan")]
    old = _t([lr])
    ids = torch.tensor([[0, 1, 2, 3, 4]])
    keep = chunk_mismatch_mask(old, torch.zeros_like(old), ids)
    assert keep.tolist() == [[True, True, False, False, False]] and keep.dtype == torch.bool
    # ratio_low = 0 is no lower bound (log 0 = -inf); ratio_high = 0 keeps nothing finite
    keep = chunk_mismatch_mask(old, torch.zeros_like(old), ids, ratio_low=0.0, ratio_high=None)
    assert keep.tolist() == [[True, True, True, True, False]]
    keep = chunk_mismatch_mask(old, torch.zeros_like(old), ids, ratio_low=None, ratio_high=0.0)
    assert keep.tolist() == [[False] * 5]
    with pytest.raises(ValueError, match=r"^rollout_log_probs has shape \[1, 4\], expected \[1, 5\] like old_log_probs$"):
        chunk_mismatch_mask(old, old[:, :4], ids)
    with pytest.raises(ValueError, match=r"^old_log_probs has shape \[5\], expected \[B, T\]$"):
        chunk_mismatch_mask(old[0], old[0], ids[0])


def test_mismatch_mask_difference_band_is_inclusive_and_one_sided():
    # probability differences pi_old - mu per single-token chunk: 0.25, -0.25, 0 (exact in binary)
    old = torch.log(_t([[0.5, 0.25, 0.5]]))
    rollout = torch.log(_t([[0.25, 0.5, 0.5]]))
    ids = torch.tensor([[0, 1, 2]])
    free = dict(ratio_low=None, ratio_high=None)
    assert chunk_mismatch_mask(old, rollout, ids, **free, diff_low=-0.25, diff_high=0.25).tolist() == [[True] * 3]
    assert chunk_mismatch_mask(old, rollout, ids, **free, diff_low=-0.2).tolist() == [[True, False, True]]
    assert chunk_mismatch_mask(old, rollout, ids, **free, diff_high=0.2).tolist() == [[False, True, True]]
    assert chunk_mismatch_mask(old, rollout, ids, **free, diff_low=0.0, diff_high=0.0).tolist() == [[False, False, True]]


def test_single_token_rows_and_single_chunk_slots():
    ids = torch.tensor([[0], [-1]])
    assert num_chunks(ids).tolist() == [1, 0]  # T = 1 is not the empty-layout case
    out = chunk_to_tokens(_t([[3.0], [4.0]]), ids, fill=-1.0)  # K = 1 is not the no-slot case
    assert out.tolist() == [[3.0], [-1.0]]


def test_mismatch_mask_bounds_below_one_and_both_bands_together():
    # single-token chunks with ratios pi_old / mu = 0.5, 0.8 (exact probabilities 0.25 / 0.5 and 0.4 / 0.5)
    old = torch.log(_t([[0.25, 0.4]]))
    rollout = torch.log(_t([[0.5, 0.5]]))
    ids = torch.tensor([[0, 1]])
    # a band wholly below 1: [0.6, 0.9] keeps only 0.8
    assert chunk_mismatch_mask(old, rollout, ids, ratio_low=0.6, ratio_high=0.9).tolist() == [[False, True]]
    # the ratio band drops 0.5; a wide difference band (-0.25 and -0.1 inside [-1, 1]) must not bring it back
    for diff in ({"diff_low": -1.0}, {"diff_high": 1.0}, {"diff_low": -1.0, "diff_high": 1.0}):
        keep = chunk_mismatch_mask(old, rollout, ids, ratio_low=0.6, ratio_high=0.9, **diff)
        assert keep.tolist() == [[False, True]], diff
    # and the difference band drops what the ratio band keeps: differences -0.25 (kept) and -0.1 (above -0.15)
    keep = chunk_mismatch_mask(old, rollout, ids, ratio_low=0.1, ratio_high=0.9, diff_low=-0.3, diff_high=-0.15)
    assert keep.tolist() == [[True, False]]
