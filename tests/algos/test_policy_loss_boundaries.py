"""Policy losses on inputs where one operator decides the value: the defaults of every keyword,
ratios exactly on a clip bound, zero advantages, empty masks, and the wrapper's correction and
aggregation plumbing. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos.policy_losses import (
    _frac,
    cispo,
    gspo,
    kimi15,
    log_ratio,
    ppo,
    ratio_summary,
    reinforce,
    sapo,
    topr,
)
from tests.algos._inputs import grad_of

F64 = torch.float64


def _t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


def _ones_mask(B, T):
    return torch.ones(B, T, dtype=torch.bool)


# ---- per_token_policy_loss: the correction keywords and their defaults -------------------------------------


def _reinforce_inputs():
    # reinforce with lp = -1 and A = 1 has token loss exactly 1, so the loss is the mean correction weight
    lp = torch.full((1, 3), -1.0, dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    adv = torch.ones(1, 3, dtype=F64)
    # rho = pi_old / mu = [4, 1.5, 0.25]  (exact in float64: exp(log(x)) == x for these)
    rollout = -torch.log(_t([[4.0, 1.5, 0.25]]))
    return lp, old, adv, _ones_mask(1, 3), rollout


def test_tis_defaults_to_token_level_with_cap_two():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    loss, metrics = reinforce(lp, old, adv, mask, rollout_log_probs=rollout, correction="tis")
    # token level, cap 2: weights [2, 1.5, 0.25] -> mean 3.75 / 3 = 1.25 (sequence level would be
    # rho = 4 * 1.5 * 0.25 = 1.5 on every token, mean 1.5)
    assert loss.item() == pytest.approx(1.25, rel=1e-12)
    assert metrics["is_capped_frac"].item() == pytest.approx(1 / 3)
    assert metrics["is_weight_mean"].item() == pytest.approx(1.25, rel=1e-12)


def test_tis_cap_and_level_are_passed_through():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    loss, _ = reinforce(lp, old, adv, mask, rollout_log_probs=rollout, correction="tis", correction_cap=3.0)
    assert loss.item() == pytest.approx((3.0 + 1.5 + 0.25) / 3, rel=1e-12)
    loss, _ = reinforce(
        lp, old, adv, mask, rollout_log_probs=rollout, correction="tis", correction_level="sequence", correction_cap=1.2
    )
    assert loss.item() == pytest.approx(1.2, rel=1e-12)  # sequence rho 1.5, capped at 1.2 on every token


def test_mis_defaults_keep_ratios_in_half_to_two():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    loss, metrics = reinforce(lp, old, adv, mask, rollout_log_probs=rollout, correction="mis")
    # band [0.5, 2]: 4 and 0.25 are rejected, 1.5 kept with weight 1.5 -> 1.5 / 3 = 0.5
    assert loss.item() == pytest.approx(0.5, rel=1e-12)
    assert metrics["is_rejected_frac"].item() == pytest.approx(2 / 3)
    # rho exactly on the default bounds 0.5 and 2 is kept (both exact in float64)
    on_bounds = -torch.log(_t([[2.0, 0.5, 1.0]]))
    loss, _ = reinforce(lp, old, adv, mask, rollout_log_probs=on_bounds, correction="mis")
    assert loss.item() == pytest.approx((2.0 + 0.5 + 1.0) / 3, rel=1e-12)


def test_mis_band_is_passed_through():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    loss, _ = reinforce(
        lp, old, adv, mask, rollout_log_probs=rollout, correction="mis", correction_low=0.2, correction_high=1.0
    )
    assert loss.item() == pytest.approx(0.25 / 3, rel=1e-12)  # only 0.25 is inside [0.2, 1]
    loss, _ = reinforce(
        lp, old, adv, mask, rollout_log_probs=rollout, correction="mis", correction_low=1.0, correction_high=5.0
    )
    assert loss.item() == pytest.approx((4.0 + 1.5) / 3, rel=1e-12)


def test_rollout_without_correction_reports_metrics_but_leaves_the_loss():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    plain, plain_metrics = reinforce(lp, old, adv, mask)
    loss, metrics = reinforce(lp, old, adv, mask, rollout_log_probs=rollout)
    assert loss.item() == plain.item() == 1.0
    assert "mismatch_kl_k1" not in plain_metrics
    # k1 = mean(-(log pi_old - log mu)) = -mean(log [4, 1.5, 0.25]) = -log(1.5) / 3
    assert metrics["mismatch_kl_k1"].item() == pytest.approx(-math.log(1.5) / 3, rel=1e-12)
    assert metrics["is_weight_mean"].item() == 1.0


def test_correction_weight_multiplies_the_weights():
    lp, old, adv, mask, rollout = _reinforce_inputs()
    weights = _t([[1.0, 2.0, 4.0]])
    loss, _ = reinforce(lp, old, adv, mask, weights=weights, rollout_log_probs=rollout, correction="tis")
    assert loss.item() == pytest.approx((1 * 2.0 + 2 * 1.5 + 4 * 0.25) / 3, rel=1e-12)
    loss, _ = reinforce(lp, old, adv, mask, weights=weights)
    assert loss.item() == pytest.approx(7 / 3, rel=1e-12)


def test_correction_without_rollout_names_the_mode():
    lp, old, adv, mask, _ = _reinforce_inputs()
    with pytest.raises(ValueError, match=r"^correction='mis' needs rollout_log_probs \(log-probs of the sampler\)$"):
        reinforce(lp, old, adv, mask, correction="mis")


def test_nan_in_weights_or_rollout_raises_only_when_masked_in():
    lp, old, adv, _, rollout = _reinforce_inputs()
    mask = torch.tensor([[True, True, False]])
    bad = _t([[1.0, 1.0, float("nan")]])
    reinforce(lp, old, adv, mask, weights=bad, rollout_log_probs=bad, correction="tis")  # NaN outside: fine
    bad_in = _t([[float("nan"), 1.0, 1.0]])
    with pytest.raises(ValueError, match=r"^weights has non-finite values"):
        reinforce(lp, old, adv, mask, weights=bad_in)
    with pytest.raises(ValueError, match=r"^rollout_log_probs has non-finite values"):
        reinforce(lp, old, adv, mask, rollout_log_probs=bad_in)
    with pytest.raises(ValueError, match=r"^weights has shape \[1, 2\], expected \[1, 3\] like log_probs$"):
        reinforce(lp, old, adv, mask, weights=torch.ones(1, 2, dtype=F64))
    with pytest.raises(ValueError, match=r"^weights has dtype torch.int64, expected a floating dtype$"):
        reinforce(lp, old, adv, mask, weights=torch.ones(1, 3, dtype=torch.long))


def test_masked_out_weights_and_rollout_do_not_leak():
    lp, old, adv, _, _ = _reinforce_inputs()
    mask = torch.tensor([[True, True, False]])
    weights = _t([[1.0, 1.0, 1e6]])
    rollout = _t([[0.0, 0.0, -50.0]])  # would be rho = e^50 on the masked-out token
    loss, metrics = reinforce(lp, old, adv, mask, weights=weights, rollout_log_probs=rollout, correction="tis")
    assert loss.item() == 1.0
    assert metrics["is_weight_mean"].item() == 1.0
    assert metrics["mismatch_kl_k1"].item() == 0.0


def test_aggregation_defaults_to_token_mean_and_passes_the_global_counts():
    # reinforce, lp = -1, A = 1: token loss 1 everywhere; row 0 has 3 tokens, row 1 has 1
    lp = torch.full((2, 3), -1.0, dtype=F64)
    adv = _t([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    loss, _ = reinforce(lp, lp, adv, mask)
    assert loss.item() == pytest.approx(6 / 4)  # token mean; the sequence mean would be (1 + 3) / 2
    loss, _ = reinforce(lp, lp, adv, mask, agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx(2.0)
    loss, _ = reinforce(lp, lp, adv, mask, global_tokens=12)
    assert loss.item() == pytest.approx(6 / 12)
    loss, _ = reinforce(lp, lp, adv, mask, agg_mode="seq-mean-token-sum", global_seqs=6)
    assert loss.item() == pytest.approx((3 + 3) / 6)
    loss, _ = reinforce(lp, lp, adv, mask, agg_mode="seq-mean-token-sum-norm", norm_len=6)
    assert loss.item() == pytest.approx((3 / 6 + 3 / 6) / 2)


def test_old_log_probs_and_advantages_are_detached():
    lp = torch.full((1, 2), -1.0, dtype=F64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    adv = torch.ones(1, 2, dtype=F64, requires_grad=True)
    loss, _ = ppo(lp, old, adv, _ones_mask(1, 2))
    loss.backward()
    assert old.grad is None and adv.grad is None
    assert lp.grad is not None


# ---- ratio metrics, _frac, log_ratio ------------------------------------------------------------------------


def test_ratio_metrics_cover_masked_tokens_only():
    old = torch.zeros(1, 4, dtype=F64)
    lp = torch.log(_t([[2.0, 0.5, 1.0, 100.0]]))
    mask = torch.tensor([[True, True, True, False]])
    _, metrics = reinforce(lp, old, torch.zeros(1, 4, dtype=F64), mask)
    assert metrics["ratio_mean"].item() == pytest.approx(3.5 / 3)
    assert metrics["ratio_max"].item() == pytest.approx(2.0)
    assert metrics["ratio_min"].item() == pytest.approx(0.5)


def test_ratio_summary_of_an_empty_mask_is_one_and_keeps_the_dtype():
    ratio = _t([[3.0, 0.25]])
    out = ratio_summary(ratio, torch.zeros(1, 2, dtype=torch.bool))
    assert {k: v.item() for k, v in out.items()} == {"ratio_mean": 1.0, "ratio_max": 1.0, "ratio_min": 1.0}
    assert all(v.dtype == F64 and v.shape == () for v in out.values())
    one = ratio_summary(ratio, torch.tensor([[False, True]]))
    assert {k: v.item() for k, v in one.items()} == {"ratio_mean": 0.25, "ratio_max": 0.25, "ratio_min": 0.25}


def test_frac_over_the_mask_and_of_an_empty_mask():
    flags = torch.tensor([[True, True, False, True]])
    assert _frac(flags, torch.tensor([[True, False, True, True]])).item() == pytest.approx(2 / 3)
    empty = _frac(flags, torch.zeros(1, 4, dtype=torch.bool))
    assert empty.item() == 0.0 and empty.dtype == torch.float32


def test_log_ratio_is_clamped_at_plus_and_minus_20():
    out = log_ratio(_t([[30.0, -30.0, 19.5, 0.0]]), _t([[0.0, 0.0, 0.0, 20.5]]))
    assert out.tolist() == [[20.0, -20.0, 19.5, -20.0]]


# ---- ppo --------------------------------------------------------------------------------------------------


def test_ppo_default_clip_is_point_two_on_both_sides():
    # r = e^0.3 = 1.35 (A = +1): loss -1.2; r = e^-0.3 = 0.74 (A = -1): loss max(0.74, 0.8) = 0.8
    # r = e^0.1 = 1.105 (A = +1) and e^-0.1 = 0.905 (A = -1) are inside: -1.105 and 0.905
    lp = _t([[0.3, -0.3, 0.1, -0.1]])
    old = torch.zeros(1, 4, dtype=F64)
    adv = _t([[1.0, -1.0, 1.0, -1.0]])
    loss, metrics = ppo(lp, old, adv, _ones_mask(1, 4), agg_mode="seq-mean-token-sum")
    expected = -1.2 + 0.8 - math.exp(0.1) + math.exp(-0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["clipfrac_high"].item() == pytest.approx(0.25)
    assert metrics["clipfrac_low"].item() == pytest.approx(0.25)
    assert "dual_clipfrac" not in metrics  # the dual clip is off by default


def test_ppo_ratio_exactly_on_the_bound_is_not_a_clip():
    # clip_low = clip_high = 0: both bounds are 1 and r = 1 exactly; r < 1 and r > 1 are both False
    lp = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    adv = _t([[1.0, -1.0]])
    loss, metrics = ppo(lp, lp.detach(), adv, _ones_mask(1, 2), clip_low=0.0, clip_high=0.0)
    assert metrics["clipfrac_low"].item() == 0.0
    assert metrics["clipfrac_high"].item() == 0.0
    assert loss.item() == 0.0


def test_ppo_dual_clip_bound_equal_to_the_loss_keeps_the_gradient():
    # A = -1, r = 2 exactly, clip 0.2: surrogate loss max(2, 1.2) = 2 and the bound -A c = 2 with c = 2:
    # the bound is not below the loss, so the token keeps the PPO gradient d(-A r)/d lp = r = 2
    lp = torch.tensor([[math.log(2.0)]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=F64)
    adv = _t([[-1.0]])
    loss, metrics = ppo(lp, old, adv, _ones_mask(1, 1), dual_clip=2.0)
    assert loss.item() == 2.0
    assert metrics["dual_clipfrac"].item() == 0.0
    assert grad_of(loss, lp).item() == pytest.approx(2.0)
    # c = 1.5 < 2: the bound 1.5 wins, with zero gradient
    loss, metrics = ppo(lp, old, adv, _ones_mask(1, 1), dual_clip=1.5)
    assert loss.item() == 1.5
    assert metrics["dual_clipfrac"].item() == 1.0
    assert grad_of(loss, lp).item() == 0.0


def test_ppo_dual_clip_leaves_positive_and_zero_advantages():
    # A = +1, r = e^2: loss -1.2 (the upper clip); A = 0: loss 0; A = 0.5, r = e^-1: loss -0.5 e^-1
    # (below -A c = -0.55, but the dual clip bounds only negative advantages); with c = 1.1
    lp = _t([[2.0, 2.0, 2.0, -1.0]])
    old = torch.zeros(1, 4, dtype=F64)
    adv = _t([[1.0, 0.0, -1.0, 0.5]])
    loss, metrics = ppo(lp, old, adv, _ones_mask(1, 4), dual_clip=1.1, agg_mode="seq-mean-token-sum")
    # A = -1, r = e^2 = 7.39: surrogate 7.39, bound 1.1
    assert loss.item() == pytest.approx(-1.2 + 0.0 + 1.1 - 0.5 * math.exp(-1.0), rel=1e-12)
    assert metrics["dual_clipfrac"].item() == pytest.approx(1 / 4)


# ---- gspo -------------------------------------------------------------------------------------------------


def test_gspo_default_clip_is_3e4_below_and_4e4_above():
    # one token per sequence, A = +1 and -1; s = e^x
    xs = [3.5e-4, 4.5e-4, -2.5e-4, -3.5e-4]
    lp = _t([[x] for x in xs])  # [4, 1]
    old = torch.zeros(4, 1, dtype=F64)
    for a in (1.0, -1.0):
        adv = torch.full((4, 1), a, dtype=F64)
        loss, metrics = gspo(lp, old, adv, _ones_mask(4, 1), agg_mode="seq-mean-token-sum")
        if a > 0:  # only the upper clip is active: e^4.5e-4 -> 1 + 4e-4
            s = [math.exp(3.5e-4), 1 + 4e-4, math.exp(-2.5e-4), math.exp(-3.5e-4)]
            assert metrics["clipfrac_high"].item() == pytest.approx(0.25)
            assert metrics["clipfrac_low"].item() == 0.0
        else:  # only the lower clip: e^-3.5e-4 -> 1 - 3e-4
            s = [math.exp(3.5e-4), math.exp(4.5e-4), math.exp(-2.5e-4), 1 - 3e-4]
            assert metrics["clipfrac_low"].item() == pytest.approx(0.25)
            assert metrics["clipfrac_high"].item() == 0.0
        assert loss.item() == pytest.approx(-a * sum(s) / 4, rel=1e-12)


def test_gspo_sequence_ratio_is_the_mean_over_masked_tokens_only():
    # log-ratios [0.1, 0.3, 5.0] with the last masked out: s = e^0.2 on the two masked tokens
    lp = torch.tensor([[0.1, 0.3, 5.0]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    adv = torch.ones(1, 3, dtype=F64)
    mask = torch.tensor([[True, True, False]])
    loss, _ = gspo(lp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.2), rel=1e-12)
    # the gradient of token t is -A s / n_tokens (token-mean over 2 tokens): -e^0.2 / 2 each
    torch.testing.assert_close(grad_of(loss, lp), _t([[-math.exp(0.2) / 2] * 2 + [0.0]]))


def test_gspo_empty_row_next_to_a_full_one():
    lp = _t([[0.2, 0.2], [7.0, 7.0]])
    old = torch.zeros(2, 2, dtype=F64)
    adv = torch.ones(2, 2, dtype=F64)
    mask = torch.tensor([[True, True], [False, False]])
    loss, metrics = gspo(lp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.2), rel=1e-12)
    assert metrics["clipfrac_high"].item() == 0.0


# ---- cispo ------------------------------------------------------------------------------------------------


def test_cispo_defaults_bound_the_weight_in_zero_to_five():
    # r = e^2 = 7.39 -> weight 5; r = e^1 = 2.72 and e^-3 = 0.05 are kept (lower bound 1 - 1 = 0)
    lp = torch.tensor([[2.0, 1.0, -3.0]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    adv = _t([[1.0, 1.0, -1.0]])
    loss, metrics = cispo(lp, old, adv, _ones_mask(1, 3), agg_mode="seq-mean-token-sum")
    weights = [5.0, math.e, math.exp(-3.0)]
    expected = -(weights[0] * 2.0) - (weights[1] * 1.0) + weights[2] * -3.0
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    # the weight is detached: d loss / d lp_t = -w_t A_t
    torch.testing.assert_close(grad_of(loss, lp), _t([[-5.0, -math.e, math.exp(-3.0)]]))
    assert metrics["clipfrac_high"].item() == pytest.approx(1 / 3)
    assert metrics["clipfrac_low"].item() == 0.0


# ---- topr -------------------------------------------------------------------------------------------------


def test_topr_ratio_level_must_be_token_or_sequence():
    lp = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"^ratio_level is 'seq', expected 'token' or 'sequence'$"):
        topr(lp, lp, lp, _ones_mask(1, 2), ratio_level="seq")


def test_topr_score_zero_and_advantage_sum_zero_are_negative():
    # negative sequences get the IS weight clip(r, 0, 1): r = e^-1 < 1 changes the loss, r = e^1 is cut to 1
    lp = torch.tensor([[-1.0, 1.0]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=F64)
    adv = _t([[1.0, -1.0]])  # sums to 0: not > 0, so negative
    loss, metrics = topr(lp, old, adv, _ones_mask(1, 2), agg_mode="seq-mean-token-sum")
    # -(e^-1 * 1 * -1) - (1 * -1 * 1) = e^-1 + 1
    assert loss.item() == pytest.approx(math.exp(-1.0) + 1.0, rel=1e-12)
    assert metrics["positive_frac"].item() == 0.0
    assert metrics["truncated_frac"].item() == pytest.approx(0.5)  # only r = e > 1 is truncated
    # advantages [1, -0.5] sum to 0.5 > 0: positive, plain -A log pi = -(1 * -1) - (-0.5 * 1) = 1.5
    loss_half, _ = topr(lp, old, _t([[1.0, -0.5]]), _ones_mask(1, 2), agg_mode="seq-mean-token-sum")
    assert loss_half.item() == pytest.approx(1.5)
    loss0, _ = topr(lp, old, adv, _ones_mask(1, 2), scores=_t([0.0]), agg_mode="seq-mean-token-sum")
    assert loss0.item() == pytest.approx(loss.item(), rel=1e-12)
    loss_pos, m_pos = topr(lp, old, adv, _ones_mask(1, 2), scores=_t([0.5]), agg_mode="seq-mean-token-sum")
    # positive: plain -A log pi = -(1 * -1) - (-1 * 1) = 2
    assert loss_pos.item() == pytest.approx(2.0)
    assert m_pos["positive_frac"].item() == 1.0 and m_pos["truncated_frac"].item() == 0.0


def test_topr_ratio_exactly_one_is_not_truncated_and_weights_default_to_one():
    lp = torch.zeros(2, 2, dtype=F64)
    adv = _t([[-2.0, -2.0], [3.0, 3.0]])
    loss, metrics = topr(lp - 1.0, lp - 1.0, adv, _ones_mask(2, 2), agg_mode="seq-mean-token-sum")
    # row 0 negative, r = 1: -(1 * -2 * -1) * 2 = -4; row 1 positive: -(3 * -1) * 2 = 6; mean over rows 1
    assert loss.item() == pytest.approx(1.0)
    assert metrics["truncated_frac"].item() == 0.0
    assert metrics["positive_frac"].item() == pytest.approx(0.5)
    loss_w, _ = topr(
        lp - 1.0, lp - 1.0, adv, _ones_mask(2, 2), agg_mode="seq-mean-token-sum", positive_weight=2.0,
        negative_weight=0.5,
    )
    assert loss_w.item() == pytest.approx((-4 * 0.5 + 6 * 2.0) / 2)


def test_topr_sequence_ratio_is_the_product_of_token_ratios():
    # log-ratios -0.5 and +0.2 in a negative sequence: token level weights [e^-0.5, 1],
    # sequence level e^-0.3 on both tokens
    lp = torch.tensor([[-0.5, 0.2]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=F64)
    adv = _t([[-1.0, -1.0]])
    mask = _ones_mask(1, 2)
    tok, m_tok = topr(lp, old, adv, mask, agg_mode="seq-mean-token-sum")
    seq, m_seq = topr(lp, old, adv, mask, agg_mode="seq-mean-token-sum", ratio_level="sequence")
    assert tok.item() == pytest.approx(math.exp(-0.5) * -0.5 + 1.0 * 0.2, rel=1e-12)
    assert seq.item() == pytest.approx(math.exp(-0.3) * (-0.5 + 0.2), rel=1e-12)
    assert m_tok["truncated_frac"].item() == pytest.approx(0.5)
    assert m_seq["truncated_frac"].item() == 0.0


def test_topr_positive_frac_ignores_empty_sequences_and_truncated_frac_counts_masked_tokens():
    lp = _t([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.zeros(3, 3, dtype=F64)
    adv = _t([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    _, metrics = topr(lp, old, adv, mask, scores=_t([-1.0, 1.0, 1.0]))
    assert metrics["positive_frac"].item() == pytest.approx(0.5)  # rows 0 (neg) and 1 (pos); row 2 empty
    assert metrics["truncated_frac"].item() == pytest.approx(2 / 3)  # row 0's two masked tokens of 3


# ---- sapo -------------------------------------------------------------------------------------------------


def test_sapo_taus_must_be_positive_and_are_named():
    lp = torch.zeros(1, 1, dtype=F64)
    for kw, shown in (({"tau_pos": 0.0}, "0.0 and 1.05"), ({"tau_neg": 0.0}, "1.0 and 0.0"), ({"tau_pos": -1}, "-1 and 1.05")):
        with pytest.raises(ValueError, match=rf"^tau_pos and tau_neg must be > 0, got {shown}$"):
            sapo(lp, lp, lp, _ones_mask(1, 1), **kw)


def test_sapo_taus_below_one_are_accepted_and_a_small_positive_advantage_uses_tau_pos():
    # r = e^1, A = 0.5 > 0: tau = tau_pos = 0.5; l = -(4 / 0.5) sigmoid(0.5 (e - 1)) * 0.5
    lp = _t([[1.0]])
    old = torch.zeros(1, 1, dtype=F64)
    loss, metrics = sapo(lp, old, _t([[0.5]]), _ones_mask(1, 1), tau_pos=0.5, tau_neg=0.25)
    s = 1 / (1 + math.exp(-0.5 * (math.e - 1)))
    assert loss.item() == pytest.approx(-8 * s * 0.5, rel=1e-12)
    assert metrics["gate_weight_mean"].item() == pytest.approx(4 * s * (1 - s), rel=1e-12)


def test_sapo_on_policy_uses_the_default_taus():
    # r = 1: gate 1/2, l = -(4 / tau) / 2 * A = -2 A / tau with tau 1 for A > 0 and 1.05 otherwise
    lp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    adv = _t([[1.0, -1.0, 0.0]])
    loss, metrics = sapo(lp, lp.detach(), adv, _ones_mask(1, 3), agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-2.0 + 2 / 1.05, rel=1e-12)
    assert metrics["gate_weight_mean"].item() == pytest.approx(1.0)
    # gradient d/dlp of -(4/tau) sigmoid(tau (r - 1)) A at r = 1: -(4/tau) * tau/4 * A = -A
    torch.testing.assert_close(grad_of(loss, lp), _t([[-1.0, 1.0, 0.0]]))


def test_sapo_gate_weight_uses_tau_neg_on_zero_advantages():
    # r = e^1, A = 0: x = tau_neg (e - 1); weight 4 s (1 - s); the loss is 0 whatever the tau
    lp = _t([[1.0]])
    old = torch.zeros(1, 1, dtype=F64)
    loss, metrics = sapo(lp, old, torch.zeros(1, 1, dtype=F64), _ones_mask(1, 1), tau_pos=1.0, tau_neg=3.0)
    s = 1 / (1 + math.exp(-3.0 * (math.e - 1)))
    assert loss.item() == 0.0
    assert metrics["gate_weight_mean"].item() == pytest.approx(4 * s * (1 - s), rel=1e-9)


# ---- kimi15 -----------------------------------------------------------------------------------------------


def test_kimi15_default_tau_is_one_tenth():
    # A = 0, log-ratio 2: (0.1 / 2) * 2^2 = 0.2; A = 2, log-ratio 0 (lp = -1): -2 * -1 = 2
    lp = torch.tensor([[-1.0, -1.0]], dtype=F64, requires_grad=True)
    old = _t([[-3.0, -1.0]])
    adv = _t([[0.0, 2.0]])
    loss, _ = kimi15(lp, old, adv, _ones_mask(1, 2), agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.2 + 2.0, rel=1e-12)
    # d/dlp: -A + tau (lp - old) = [0.2, -2]
    torch.testing.assert_close(grad_of(loss, lp), _t([[0.2, -2.0]]))


# ---- registry -----------------------------------------------------------------------------------------------


def test_a_taken_name_is_refused_naming_the_kind_and_the_name():
    from credo.algos import POLICY_LOSSES, register_policy_loss

    with pytest.raises(ValueError, match=r"^policy loss 'ppo' is already registered by credo\.algos\.policy_losses\."):
        register_policy_loss("ppo")(reinforce)
    assert POLICY_LOSSES["ppo"] is ppo
