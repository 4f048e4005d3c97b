"""KL estimators, value loss, entropy and the train/inference correction function."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos import KL_ESTIMATORS, aggregate, entropy_from_logits, train_infer_correction, value_loss
from tests.algos._inputs import grad_of, make_mask
from tests.reference_registry import REFERENCES, load_registries

load_registries()
KL_NAMES = sorted(KL_ESTIMATORS)


@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_matches_naive_reference_and_finite_differences(name):
    ref = REFERENCES.get(("kl", name))
    if ref is None:
        pytest.fail(f"no naive reference for KL estimator {name!r}")
    g = torch.Generator().manual_seed(0)
    for B, T in [(1, 1), (3, 4)]:
        lp = (-3 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
        ref_lp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
        got = KL_ESTIMATORS[name](lp, ref_lp)
        torch.testing.assert_close(got, ref(lp, ref_lp))
        torch.autograd.gradcheck(lambda x: KL_ESTIMATORS[name](x, ref_lp), (lp,))
    # the clamped estimator saturates at 10 when pi_ref gives the token far less mass
    lp = torch.tensor([[0.0]], dtype=torch.float64)
    far = torch.tensor([[-15.0]], dtype=torch.float64)
    torch.testing.assert_close(KL_ESTIMATORS[name](lp, far), ref(lp, far))


@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_hostile_inputs_and_mask(name):
    lp = torch.tensor([[0.0, -30.0, -1.0, float("nan")]], requires_grad=True)
    ref_lp = torch.tensor([[-30.0, 0.0, float("inf"), -1.0]])
    mask = torch.tensor([[True, True, False, False]])
    kl = KL_ESTIMATORS[name](lp, ref_lp, mask=mask)
    loss = aggregate(kl, mask)
    grad = grad_of(loss, lp)
    assert torch.isfinite(kl).all() and torch.isfinite(grad).all()
    assert torch.equal(kl[~mask], torch.zeros(2)) and torch.equal(grad[~mask], torch.zeros(2))


def test_k3_is_nonnegative_and_unbiased_in_expectation():
    # Exact expectation under pi of a 3-token distribution: sum_a pi(a) k3(a) = KL(pi || ref).
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = (pi * (pi / ref).log()).sum()
    for name in ("k1", "k3"):
        per_token = KL_ESTIMATORS[name](pi.log()[None], ref.log()[None])[0]
        torch.testing.assert_close((pi * per_token).sum(), kl)
    assert (KL_ESTIMATORS["k3"](pi.log()[None], ref.log()[None]) >= 0).all()


def test_value_loss_matches_loops():
    g = torch.Generator().manual_seed(1)
    B, T = 3, 5
    values = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    old = values.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    returns = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = make_mask(B, T, g)
    for clip in (0.2, None):
        loss, metrics = value_loss(values, old, returns, mask, clip_range=clip)
        total, n, clipped = 0.0, 0, 0
        for b in range(B):
            for t in range(T):
                if mask[b, t]:
                    v, vo, r = values[b, t], float(old[b, t]), float(returns[b, t])
                    err = (v - r) ** 2
                    if clip is not None:
                        vc = vo + max(-clip, min(clip, float(v.detach()) - vo))
                        vc = v if abs(float(v.detach()) - vo) <= clip else torch.tensor(vc, dtype=torch.float64)
                        if float(((vc - r) ** 2).detach()) > float(err.detach()):
                            err, clipped = (vc - r) ** 2, clipped + 1
                    total, n = total + 0.5 * err, n + 1
        expected = total / max(n, 1)
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(grad_of(loss, values), grad_of(expected, values))
        if clip is not None:
            assert metrics["vf_clipfrac"].item() == pytest.approx(clipped / n)


def test_value_clipfrac_does_not_count_rounding_as_clipping():
    # fp32: V_old + (V - V_old) is -0.030000001 != V = -0.03, so a clip-by-difference counts the
    # token as clipped (vf_clipfrac 1.0) although |V - V_old| = 0.07 < 0.2. Clamping V itself does not.
    values = torch.tensor([[-0.03]], requires_grad=True)
    old, returns, mask = torch.tensor([[0.04]]), torch.tensor([[0.0]]), torch.tensor([[True]])
    assert (old + (values.detach() - old).clamp(-0.2, 0.2)).item() != values.item()  # the rounding
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    assert metrics["vf_clipfrac"].item() == 0.0
    assert torch.equal(loss, value_loss(values, old, returns, mask, clip_range=None)[0])
    assert loss.item() == pytest.approx(0.5 * 0.03**2)
    assert grad_of(loss, values).item() == pytest.approx(-0.03)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_value_loss_inside_the_band_equals_unclipped_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(5)
    old = (0.1 * torch.randn(6, 50, generator=g)).to(dtype)  # near 0: V and V_old often differ in sign
    values = (old.float() + 0.19 * (2 * torch.rand(6, 50, generator=g) - 1)).to(dtype)
    assert bool(((values.float() - old.float()).abs() < 0.2).all())
    returns = torch.randn(6, 50, generator=g).to(dtype)
    mask = make_mask(6, 50, g)
    clipped, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    unclipped, _ = value_loss(values, old, returns, mask, clip_range=None)
    assert metrics["vf_clipfrac"].item() == 0.0
    assert torch.equal(clipped, unclipped)
    # outside the band, with R beyond V: V_clip = V_old + 0.2 is farther from R, so every token counts
    far = value_loss(old + 0.5, old, old + 3, torch.ones(6, 50, dtype=torch.bool), clip_range=0.2)[1]
    assert far["vf_clipfrac"].item() == 1.0


def test_entropy_matches_naive_and_is_stable():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    got = entropy_from_logits(logits)
    for i in range(2):
        for j in range(3):
            z = [math.exp(x) for x in logits[i, j].tolist()]
            p = [x / sum(z) for x in z]
            assert got[i, j].item() == pytest.approx(-sum(q * math.log(q) for q in p))
    extreme = torch.tensor([[1e4, 0.0, -float("inf")], [-float("inf"), 3.0, 3.0]], requires_grad=True)
    h = entropy_from_logits(extreme)
    torch.testing.assert_close(h, torch.tensor([0.0, math.log(2)]))
    assert torch.isfinite(grad_of(h.sum(), extreme)).all()


def test_train_infer_correction_hand_worked():
    # Sequence 0: token log-ratios old - rollout = (log 2, log 0.5, log 4); sequence 1 empty.
    old = torch.tensor([[math.log(2), math.log(0.5), math.log(4)], [0.0, 0.0, 0.0]], dtype=torch.float64)
    rollout = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    w, keep, m = train_infer_correction(old, rollout, mask, mode="tis", level="token", cap=3.0)
    torch.testing.assert_close(w[0], torch.tensor([2.0, 0.5, 3.0], dtype=torch.float64))
    assert m["is_capped_frac"].item() == pytest.approx(1 / 3)
    # ESS of (2, 0.5, 3): (5.5)^2 / (3 * 13.25)
    assert m["is_ess"].item() == pytest.approx(5.5**2 / (3 * 13.25))
    # k1 of KL(mu || pi_old): mean of -(old - rollout) = -log(4) / 3; k3: mean of (rho - 1 - log rho)
    assert m["mismatch_kl_k1"].item() == pytest.approx(-math.log(4) / 3)
    assert m["mismatch_kl_k3"].item() == pytest.approx(sum(r - 1 - math.log(r) for r in (2, 0.5, 4)) / 3)
    # sequence level: rho = 2 * 0.5 * 4 = 4 -> capped at 3; geometric: 4^(1/3)
    w, _, _ = train_infer_correction(old, rollout, mask, mode="tis", level="sequence", cap=3.0)
    torch.testing.assert_close(w[0], torch.full((3,), 3.0, dtype=torch.float64))
    w, keep, m = train_infer_correction(old, rollout, mask, mode="mis", level="geometric", low=0.5, high=1.5)
    assert not keep.any() and m["is_rejected_frac"].item() == 1.0  # 4^(1/3) = 1.587 > 1.5
    w, keep, _ = train_infer_correction(old, rollout, mask, mode="mis", level="token", low=0.4, high=2.5)
    assert keep[0].tolist() == [True, True, False]
    torch.testing.assert_close(w[0], torch.tensor([2.0, 0.5, 0.0], dtype=torch.float64))
    assert torch.equal(w[1], torch.zeros(3, dtype=torch.float64))


def test_kl_rejects_a_ref_log_probs_of_another_shape_by_name():
    for name in KL_NAMES:
        with pytest.raises(ValueError, match=r"^ref_log_probs has shape \[2, 3\], expected \[2, 4\] like log_probs$"):
            KL_ESTIMATORS[name](torch.zeros(2, 4), torch.zeros(2, 3))


def test_value_loss_default_clip_range_is_ppo_0_2():
    # V_old = 0, V = 0.5, R = 3: the band [-0.2, 0.2] clips V to 0.2, farther from R, so the
    # clipped error wins: 0.5 * (3 - 0.2)^2 = 3.92 (unclipped: 0.5 * 2.5^2 = 3.125).
    values = torch.tensor([[0.5]], dtype=torch.float64)
    old, returns, mask = torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[3.0]], dtype=torch.float64), torch.ones(1, 1)
    loss, metrics = value_loss(values, old, returns, mask)
    assert loss.item() == pytest.approx(0.5 * 2.8**2)
    assert metrics["vf_clipfrac"].item() == 1.0


def test_value_loss_names_the_non_finite_input():
    mask = torch.tensor([[True, False]])
    for bad in ("values", "old_values", "returns"):
        args = {name: torch.zeros(1, 2) for name in ("values", "old_values", "returns")}
        args[bad][0, 1] = float("nan")  # outside the mask: ignored
        value_loss(args["values"], args["old_values"], args["returns"], mask)
        args[bad][0, 0] = float("inf")
        with pytest.raises(ValueError, match=rf"^{bad} has non-finite values \(NaN or Inf\) in masked-in positions$"):
            value_loss(args["values"], args["old_values"], args["returns"], mask)


def test_train_infer_correction_validation_names_the_argument():
    old, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^rollout_log_probs has shape \[2, 2\], expected \[2, 3\] like old_log_probs$"):
        train_infer_correction(old, torch.zeros(2, 2), mask)
    bad = old.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^old_log_probs has non-finite values"):
        train_infer_correction(bad, torch.zeros(2, 3), mask)
    with pytest.raises(ValueError, match=r"^rollout_log_probs has non-finite values"):
        train_infer_correction(old, bad, mask)


def test_train_infer_correction_ess_is_scale_free():
    # Kish ESS / n = (sum w)^2 / (n sum w^2), also for weights below 1 (sum w^2 < 1).
    rho = [0.5, 0.25, 0.5]
    old = torch.tensor([[math.log(r) for r in rho]], dtype=torch.float64)
    rollout, mask = torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool)
    _, _, m = train_infer_correction(old, rollout, mask, mode="tis", level="token", cap=2.0)
    assert m["is_ess"].item() == pytest.approx(sum(rho) ** 2 / (3 * sum(r * r for r in rho)))
    _, _, m = train_infer_correction(old[:, [0, 2]], rollout[:, :2], mask[:, :2], mode="tis", level="token", cap=2.0)
    assert m["is_ess"].item() == pytest.approx(1.0)  # equal weights: every unit counts


def test_value_loss_checks_the_shape_of_values_first():
    # A 1-D values (one sequence without its batch dim) is reported as a shape error, before the
    # NaN it holds would be.
    values = torch.tensor([0.5, float("nan")])
    with pytest.raises(ValueError, match=r"^values has shape \[2\], expected 2 dimensions$"):
        value_loss(values, torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool))


@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_with_a_mask_is_the_unmasked_kl_on_masked_in_tokens(name):
    # the masked path is the one a trainer takes; its values must be the estimator's, 0 elsewhere
    g = torch.Generator().manual_seed(3)
    lp = -3 * torch.rand(3, 5, generator=g, dtype=torch.float64)
    ref_lp = -3 * torch.rand(3, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) > 0.4
    assert mask.any() and (~mask).any()
    got = KL_ESTIMATORS[name](lp, ref_lp, mask=mask)
    want = REFERENCES[("kl", name)](lp, ref_lp)
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-12)
    assert torch.equal(got[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))
