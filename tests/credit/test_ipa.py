"""IPA chunk-level policy loss against its naive reference, split invariance, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos import AGG_MODES
from credo.algos.policy_losses import POLICY_LOSSES
from credo.credit.chunks import chunk_ids
from credo.credit.ipa import ipa_loss
from tests.credit.naive_ipa import ipa as naive_ipa


def _inputs(B, T, seed, *, log_ratio_scale=0.3):
    g = torch.Generator().manual_seed(seed)
    log_probs = (-2 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = log_probs.detach() + log_ratio_scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0] = False  # one empty row
    # Chunk returns: constant over each chunk, both signs.
    ids = chunk_ids(mask)
    per_chunk = torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = torch.where(mask, per_chunk.gather(1, ids.clamp(min=0)), 0.0)
    weights = 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64)
    return log_probs, old, rollout, advantages, mask, weights


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def test_registered_as_ipa():
    assert POLICY_LOSSES["ipa"] is ipa_loss


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("with_rollout", [False, True])
def test_matches_naive_reference_values_and_gradients(agg_mode, with_rollout):
    seed = 2 * AGG_MODES.index(agg_mode) + int(with_rollout)
    lp, old, rollout, adv, mask, weights = _inputs(5, 11, seed=seed)
    kwargs = dict(agg_mode=agg_mode, weights=weights, ratio_low=0.85, ratio_high=1.1)
    if with_rollout:
        kwargs.update(rollout_log_probs=rollout, diff_low=-0.05, diff_high=0.05)
    loss, metrics = ipa_loss(lp, old, adv, mask, **kwargs)
    expected = naive_ipa(lp, old, adv, mask, **kwargs)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_grad(loss, lp), _grad(expected, lp), rtol=1e-10, atol=1e-12)
    if with_rollout:
        assert 0 < metrics["chunk_masked_frac"] < 1  # the band is exercised both ways


def test_hand_worked_positive_and_negative_chunks():
    # One row, tokens: [c0, c0, obs, c1]. Chunk 0 has return +2, chunk 1 has return -1.
    # Chunk 0: plain SL, loss terms -2 * logp. Chunk 1 (single token): log-ratio log 2 -> rho = 2,
    # clip(rho, 0, 1) = 1, term -(1)(-1) logp = +logp. With logp = (-1, -2, _, -0.5), token-mean
    # over 3 tokens: (2 + 4 - 0.5) / 3 = 11/6. Gradient: (-2, -2, 0, +1) / 3.
    lp = torch.tensor([[-1.0, -2.0, 0.0, -0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, 0.0, -0.5 - math.log(2.0)]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0, 0.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    loss, metrics = ipa_loss(lp, old, adv, mask)
    assert loss.item() == pytest.approx(11 / 6)
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-2, -2, 0, 1]], dtype=torch.float64) / 3)
    assert metrics["positive_frac"].item() == pytest.approx(2 / 3)
    assert metrics["truncated_frac"].item() == pytest.approx(1 / 3)  # the rho = 2 negative token
    # If the negative chunk's ratio is 1/4 instead, its weight is 0.25: (2 + 4 - 0.125) / 3.
    old_low = old.clone()
    old_low[0, 3] = -0.5 + math.log(4.0)
    loss, metrics = ipa_loss(lp, old_low, adv, mask)
    assert loss.item() == pytest.approx((6 - 0.125) / 3)
    assert metrics["truncated_frac"].item() == 0.0


def test_split_invariance_with_global_counts():
    lp, old, rollout, adv, mask, weights = _inputs(6, 9, seed=3)
    tokens, seqs = int(mask.sum()), int(mask.any(-1).sum())
    for agg_mode in AGG_MODES:
        common = dict(agg_mode=agg_mode, global_tokens=tokens, global_seqs=seqs, rollout_log_probs=rollout)
        full, _ = ipa_loss(lp, old, adv, mask, **common)
        parts = [
            ipa_loss(lp[s], old[s], adv[s], mask[s], **{**common, "rollout_log_probs": rollout[s]})[0]
            for s in (slice(0, 2), slice(2, 3), slice(3, 6))
        ]
        torch.testing.assert_close(sum(parts), full, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(_grad(sum(parts), lp), _grad(full, lp), rtol=1e-12, atol=1e-12)
        # Without split the local counts equal the global ones.
        local, _ = ipa_loss(lp, old, adv, mask, agg_mode=agg_mode, rollout_log_probs=rollout)
        torch.testing.assert_close(local, full)


def test_all_zero_mask_gives_finite_zero_loss_and_gradient():
    lp, old, rollout, adv, _, _ = _inputs(3, 5, seed=4)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for agg_mode in AGG_MODES:
        loss, metrics = ipa_loss(lp, old, adv, mask, agg_mode=agg_mode, rollout_log_probs=rollout)
        assert loss.item() == 0.0
        assert torch.isfinite(_grad(loss, lp)).all()
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())


def test_extreme_ratios_and_nan_outside_mask_stay_finite():
    lp, _, _, adv, mask, _ = _inputs(4, 8, seed=5)
    signs = torch.where(torch.arange(8) % 2 == 0, 30.0, -30.0).to(torch.float64)
    old = lp.detach() + signs  # token ratios e^-+30
    old = torch.where(mask, old, torch.nan)
    adv = torch.where(mask, adv, torch.nan)
    rollout = torch.where(mask, old + 30.0, torch.inf)
    loss, metrics = ipa_loss(lp, old, adv, mask, rollout_log_probs=rollout, ratio_low=None, ratio_high=None)
    assert torch.isfinite(loss)
    assert torch.isfinite(_grad(loss, lp)).all()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values())


def test_errors():
    lp, old, rollout, adv, mask, _ = _inputs(2, 4, seed=6)
    mask[1] = True
    with pytest.raises(ValueError, match="chunk_ids is -1 on a masked-in token"):
        ipa_loss(lp, old, adv, mask, chunk_ids=torch.full((2, 4), -1))
    with pytest.raises(ValueError, match="correction='tis' needs rollout_log_probs"):
        ipa_loss(lp, old, adv, mask, correction="tis")
    with pytest.raises(ValueError, match=r"advantages has shape \[2, 3\], expected \[2, 4\] like log_probs"):
        ipa_loss(lp, old, adv[:, :3], mask)
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip_ratio'"):
        ipa_loss(lp, old, adv, mask, clip_ratio=0.2)
    nan_inside = old.clone()
    nan_inside[1, 0] = torch.nan
    with pytest.raises(ValueError, match="old_log_probs has non-finite values"):
        ipa_loss(lp, nan_inside, adv, mask)
