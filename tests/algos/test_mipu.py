"""MIPU (arXiv 2606.29526): Step-1 loss, Step-2 gap estimate / schedule / decision, mismatch metrics.

The Step-1 loss is also covered by the generic registry tests (naive reference in naive_mipu.py,
split invariance, hostile inputs, masked-out NaN) in test_policy_losses.py and
test_policy_properties.py.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from credo.algos import POLICY_LOSSES, ppo
from credo.algos.mipu import mipu, mipu_accept, mipu_t_post, mipu_threshold, mipu_weights
from credo.algos.mismatch import MISMATCH_METRICS, mismatch_metrics
from tests.algos._inputs import grad_of, make_policy_inputs
from tests.algos.naive_mipu import mipu as naive_mipu

ONE_ROW = torch.ones(1, 2, dtype=torch.bool)


def test_registered_under_mipu():
    assert POLICY_LOSSES["mipu"] is mipu


def test_hand_worked_token_level():
    # token 0: pi_old/mu = e^1 = 2.718 -> truncated to 2; r = e^0.1 = 1.105 (inside 1 +- 0.2), A = 1:
    #          l = -2 * 1.105 * 1, gradient d l / d log pi = -2 * 1.105
    # token 1: pi_old/mu = e^-0.5 = 0.607; r = e^0.5 = 1.649 > 1.2 with A = 1: clipped, l = -0.607 * 1.2,
    #          gradient 0
    lp = torch.tensor([[0.1, 0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    mu = torch.tensor([[-1.0, 0.5]], dtype=torch.float64)
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = mipu(lp, old, adv, ONE_ROW, rollout_log_probs=mu)
    t0 = -2 * math.exp(0.1)
    t1 = -math.exp(-0.5) * 1.2
    assert loss.item() == pytest.approx((t0 + t1) / 2)
    assert grad_of(loss, lp)[0].tolist() == pytest.approx([-2 * math.exp(0.1) / 2, 0.0])
    assert metrics["mipu_w_mean"].item() == pytest.approx((2 + math.exp(-0.5)) / 2)
    assert metrics["mipu_w_capped_frac"].item() == pytest.approx(0.5)


def test_hand_worked_sequence_level_uses_geometric_mean():
    # log(pi_old/mu) = 1 and -0.5: geometric mean w = e^0.25 = 1.284 (< w_max 2) on both tokens
    lp = torch.tensor([[0.1, 0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    mu = torch.tensor([[-1.0, 0.5]], dtype=torch.float64)
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = mipu(lp, old, adv, ONE_ROW, rollout_log_probs=mu, sequence_level=True)
    w = math.exp(0.25)
    assert loss.item() == pytest.approx((-w * math.exp(0.1) - w * 1.2) / 2)
    assert metrics["mipu_w_mean"].item() == pytest.approx(w)
    # w_max 1.1 truncates the sequence weight
    loss, _ = mipu(lp, old, adv, ONE_ROW, rollout_log_probs=mu, sequence_level=True, w_max=1.1)
    assert loss.item() == pytest.approx((-1.1 * math.exp(0.1) - 1.1 * 1.2) / 2)


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, r = e^2: PPO loss -A r = 7.39, dual clip c = 3 bounds it at 3; w = pi_old/mu = e^0.2
    lp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-2.0]], dtype=torch.float64)
    mu = torch.tensor([[-2.2]], dtype=torch.float64)
    adv = -torch.ones(1, 1, dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, metrics = mipu(lp, old, adv, mask, rollout_log_probs=mu)
    assert loss.item() == pytest.approx(3 * math.exp(0.2))
    assert grad_of(loss, lp).item() == 0.0
    assert metrics["dual_clipfrac"].item() == 1.0
    loss, _ = mipu(lp, old, adv, mask, rollout_log_probs=mu, dual_clip=None)
    assert loss.item() == pytest.approx(math.exp(2) * math.exp(0.2))


@pytest.mark.parametrize("sequence_level", [False, True])
def test_equals_ppo_weighted_by_truncated_detached_mismatch_weight(sequence_level):
    """mipu == ppo(dual clip) with weights min(pi_old/mu, w_max) computed here by hand; same gradient,
    so the weight carries no gradient."""
    g = torch.Generator().manual_seed(11)
    lp, old, adv, mask, kw = make_policy_inputs(5, 7, g, rollout=True)
    row_shift = torch.linspace(-0.8, 0.8, 5, dtype=torch.float64)[:, None]  # some sequences truncated at 1.5
    mu = kw["rollout_log_probs"] - 0.4 * torch.randn(5, 7, generator=g, dtype=torch.float64) - row_shift
    w = torch.zeros(5, 7, dtype=torch.float64)
    for b in range(5):
        ts = [t for t in range(7) if mask[b, t]]
        for t in ts:
            if sequence_level:
                log_w = sum(float(old[b, s] - mu[b, s]) for s in ts) / len(ts)
            else:
                log_w = float(old[b, t] - mu[b, t])
            w[b, t] = min(math.exp(log_w), 1.5)
    agg = {"agg_mode": "seq-mean-token-mean"}
    loss, _ = mipu(lp, old, adv, mask, rollout_log_probs=mu, w_max=1.5, sequence_level=sequence_level, **agg)
    expected, _ = ppo(lp, old, adv, mask, weights=w, dual_clip=3.0, **agg)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad_of(loss, lp), grad_of(expected, lp))
    assert 0 < (w == 1.5).sum() < mask.sum()  # the case exercises the truncation


def test_without_sampler_log_probs_is_dual_clip_ppo():
    g = torch.Generator().manual_seed(12)
    lp, old, adv, mask, _ = make_policy_inputs(3, 4, g)
    loss, metrics = mipu(lp, old, adv, mask)
    expected, _ = ppo(lp, old, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(loss, expected)
    assert metrics["mipu_w_capped_frac"].item() == 0.0


@pytest.mark.parametrize("w_max", [0.99, 0.0, -1.0, float("nan"), "2", True])
def test_w_max_below_one_raises_naming_it(w_max):
    lp = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^w_max is .*expected a number >= 1"):
        mipu(lp, lp, lp, ONE_ROW, rollout_log_probs=lp, w_max=w_max)
    with pytest.raises(ValueError, match=r"^w_max is "):
        mipu_weights(lp, lp, ONE_ROW, w_max=w_max)


def test_weights_reject_integer_log_probs_naming_them():
    with pytest.raises(ValueError, match=r"^old_log_probs has dtype torch.int64, expected a floating dtype"):
        mipu_weights(torch.tensor([[0, -1]]), torch.zeros(1, 2), ONE_ROW)


def test_w_max_one_keeps_weights_at_most_one():
    g = torch.Generator().manual_seed(13)
    _, old, _, mask, kw = make_policy_inputs(4, 6, g, rollout=True)
    w = mipu_weights(old, kw["rollout_log_probs"], mask, w_max=1)
    assert bool((w <= 1).all()) and bool((w[~mask] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sequence_level", [False, True])
def test_finite_under_extreme_ratios_and_empty_masks(dtype, sequence_level):
    lp = torch.tensor([[0.0, -50.0, -1.0], [-90.0, 0.0, -3.0]], dtype=dtype, requires_grad=True)
    old = torch.tensor([[-60.0, 0.0, -1.0], [0.0, -70.0, -3.0]], dtype=dtype)
    mu = torch.tensor([[0.0, -80.0, -1.0], [-100.0, 0.0, -3.0]], dtype=dtype)
    adv = torch.tensor([[1e4, -1e4, 1.0], [-1e4, 1e4, 0.0]], dtype=dtype)
    for mask in (torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool),
                 torch.tensor([[True, False, False], [False, False, False]])):
        loss, metrics = mipu(lp, old, adv, mask, rollout_log_probs=mu, sequence_level=sequence_level,
                             agg_mode="seq-mean-token-mean")
        assert torch.isfinite(loss) and torch.isfinite(grad_of(loss, lp)).all()
        assert all(torch.isfinite(torch.as_tensor(v)) for v in metrics.values()), metrics
        if not mask.any():
            assert loss.item() == 0.0
        w = mipu_weights(old, mu, mask, sequence_level=sequence_level)
        assert bool((w <= 2).all()) and bool((w >= 0).all())


def test_naive_reference_reproduces_a_hand_value():
    # guards the reference itself: the hand-worked case above through the naive loops
    lp = torch.tensor([[0.1, 0.5]], dtype=torch.float64, requires_grad=True)
    loss = naive_mipu(lp, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64), ONE_ROW,
                      rollout_log_probs=torch.tensor([[-1.0, 0.5]], dtype=torch.float64))
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) - math.exp(-0.5) * 1.2) / 2)


# ---- Step 2 ---------------------------------------------------------------------------------


def test_t_post_hand_computed():
    # row 0: mean log-ratio (0.2 + 0.4) / 2 = 0.3, rho = e^0.3, A = 1
    # row 1: one token, log-ratio -0.5, rho = e^-0.5, A = -2   (third token masked out, NaN there)
    # row 2: empty, ignored
    lp = torch.tensor([[0.2, 0.4, 0.0], [-0.5, 0.0, float("nan")], [1.0, 1.0, 1.0]])
    mu = torch.zeros(3, 3)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    adv = torch.tensor([1.0, -2.0, 5.0])
    expected = -(math.exp(0.3) * 1 + math.exp(-0.5) * -2) / 2
    assert mipu_t_post(lp, mu, adv, mask) == pytest.approx(expected, rel=1e-6)
    # no mismatch: rho = 1, T_post = -mean A
    assert mipu_t_post(mu, mu, adv, torch.ones(3, 3, dtype=torch.bool)) == pytest.approx(-4 / 3)


def test_t_post_extreme_ratio_is_finite_and_errors_name_the_argument():
    lp = torch.tensor([[500.0]])
    assert math.isfinite(mipu_t_post(lp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match=r"advantages has shape \[3\], expected \[1\]"):
        mipu_t_post(lp, lp, torch.ones(3), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"sampler_log_probs_new has shape \[2, 1\]"):
        mipu_t_post(lp, torch.zeros(2, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has no masked-in token"):
        mipu_t_post(lp, lp, torch.ones(1), torch.zeros(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^advantages has non-finite"):
        mipu_t_post(lp, lp, torch.tensor([float("nan")]), torch.ones(1, 1, dtype=torch.bool))


def test_threshold_linear_anneal_then_constant():
    # Qwen3-1.7B schedule: 4e-3 -> 1e-3 over 100 steps
    assert mipu_threshold(0, 4e-3, 1e-3) == pytest.approx(4e-3)
    assert mipu_threshold(50, 4e-3, 1e-3) == pytest.approx(2.5e-3)
    assert mipu_threshold(25, 4e-3, 1e-3) == pytest.approx(3.25e-3)
    assert mipu_threshold(100, 4e-3, 1e-3) == pytest.approx(1e-3)
    assert mipu_threshold(780, 4e-3, 1e-3) == pytest.approx(1e-3)
    assert mipu_threshold(5, 1e-3, 0.0, anneal_steps=10) == pytest.approx(5e-4)
    assert mipu_threshold(0, 1e-3, 0.0, anneal_steps=0) == 0.0
    with pytest.raises(ValueError, match="^step is -1"):
        mipu_threshold(-1, 1e-3, 0.0)
    with pytest.raises(ValueError, match="^anneal_steps is 2.5"):
        mipu_threshold(1, 1e-3, 0.0, anneal_steps=2.5)
    with pytest.raises(ValueError, match="^c_end is nan"):
        mipu_threshold(1, 1e-3, float("nan"))


def test_accept_iff_t_post_at_least_minus_c():
    assert mipu_accept(0.0, 0.0)
    assert mipu_accept(-1e-3, 1e-3)  # boundary: accepted
    assert not mipu_accept(-1.1e-3, 1e-3)
    assert mipu_accept(0.5, -1e-4)
    assert not mipu_accept(5e-5, -1e-4)  # a negative tolerance demands improvement
    with pytest.raises(ValueError, match="^t_post is nan"):
        mipu_accept(float("nan"), 0.0)


# ---- mismatch metrics -------------------------------------------------------------------------


def _naive_metrics(pi, mu, mask):
    d = [float(pi[b, t] - mu[b, t]) for b in range(pi.shape[0]) for t in range(pi.shape[1]) if mask[b, t]]
    r = [math.exp(x) for x in d]
    q = statistics.quantiles(d, n=100, method="inclusive") if len(d) > 1 else [d[0]] * 99
    return {
        "mismatch/k3": sum(ri - 1 - di for ri, di in zip(r, d)) / len(d),
        "mismatch/log_ratio_p1": q[0],
        "mismatch/log_ratio_p50": q[49],
        "mismatch/log_ratio_p99": q[98],
        "mismatch/ess": sum(r) ** 2 / (len(r) * sum(x * x for x in r)),
        "mismatch/max_ratio": max(r),
    }


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (8, 40)])
def test_mismatch_metrics_match_naive(shape):
    g = torch.Generator().manual_seed(sum(shape))
    pi = -3 * torch.rand(*shape, generator=g)
    mu = pi + 0.3 * torch.randn(*shape, generator=g)
    mask = torch.rand(*shape, generator=g) < 0.7
    mask[0, 0] = True
    got = mismatch_metrics(pi, mu, mask)
    assert set(got) == set(MISMATCH_METRICS)
    assert all(isinstance(v, float) for v in got.values())
    for k, v in _naive_metrics(pi.double(), mu.double(), mask).items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_mismatch_k3_estimates_kl_mu_to_pi():
    # 4 tokens drawn in exact proportion to mu = (1/2, 1/4, 1/4): x0, x0, x1, x2; pi = (0.1, 0.3, 0.6).
    # mean k3 = sum_x mu(x) (pi/mu - 1 - log(pi/mu)) = sum pi - 1 + KL(mu || pi) = KL(mu || pi) = 0.540,
    # not KL(pi || mu) = 0.419
    mu_p, pi_p = [0.5, 0.25, 0.25], [0.1, 0.3, 0.6]
    tokens = [0, 0, 1, 2]
    pi = torch.tensor([[math.log(pi_p[x]) for x in tokens]])
    mu = torch.tensor([[math.log(mu_p[x]) for x in tokens]])
    got = mismatch_metrics(pi, mu, torch.ones(1, 4, dtype=torch.bool))["mismatch/k3"]
    kl_mu_pi = sum(m * math.log(m / p) for m, p in zip(mu_p, pi_p))
    kl_pi_mu = sum(p * math.log(p / m) for m, p in zip(mu_p, pi_p))
    assert got == pytest.approx(kl_mu_pi, rel=1e-6)
    assert abs(kl_mu_pi - kl_pi_mu) > 0.1


def test_mismatch_hand_values():
    # log-ratios 0, log 2, -log 2 (three tokens): ratios 1, 2, 1/2
    pi = torch.tensor([[0.0, math.log(2), -math.log(2)], [9.0, 9.0, 9.0]], dtype=torch.float64)
    mu = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    got = mismatch_metrics(pi, mu, mask)
    assert got["mismatch/max_ratio"] == pytest.approx(2.0)
    assert got["mismatch/ess"] == pytest.approx(3.5**2 / (3 * 5.25))
    assert got["mismatch/k3"] == pytest.approx((0 + (1 - math.log(2)) + (-0.5 + math.log(2))) / 3)
    assert got["mismatch/log_ratio_p50"] == pytest.approx(0.0)
    # p1 at position 0.02 between -log 2 and 0; p99 at 1.98 between 0 and log 2
    assert got["mismatch/log_ratio_p1"] == pytest.approx(-math.log(2) * 0.98)
    assert got["mismatch/log_ratio_p99"] == pytest.approx(math.log(2) * 0.98)
    # identical policies: no mismatch
    same = mismatch_metrics(mu, mu, mask)
    assert same["mismatch/k3"] == 0.0 and same["mismatch/ess"] == 1.0 and same["mismatch/max_ratio"] == 1.0


def test_mismatch_empty_mask_nan_and_extremes_finite():
    pi = torch.tensor([[0.0, -80.0]])
    mu = torch.tensor([[-90.0, 0.0]])
    empty = mismatch_metrics(pi, mu, torch.zeros(1, 2, dtype=torch.bool))
    assert set(empty) == set(MISMATCH_METRICS) and all(math.isnan(v) for v in empty.values())
    full = mismatch_metrics(pi, mu, torch.ones(1, 2))
    assert all(math.isfinite(v) for v in full.values()), full
    assert full["mismatch/max_ratio"] == pytest.approx(math.exp(20))
    assert full["mismatch/log_ratio_p99"] == pytest.approx(90 - 0.01 * 170)  # quantiles are unclamped
    with pytest.raises(ValueError, match=r"sampler_log_probs has shape \[1, 3\]"):
        mismatch_metrics(pi, torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^trainer_log_probs has non-finite"):
        mismatch_metrics(torch.tensor([[float("nan"), 0.0]]), mu, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^trainer_log_probs has dtype torch.int64, expected a floating dtype"):
        mismatch_metrics(torch.tensor([[0, -1]]), mu, torch.ones(1, 2, dtype=torch.bool))
