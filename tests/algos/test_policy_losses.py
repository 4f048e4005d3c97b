"""Policy losses against their naive references, hand-worked cases, metrics and contracts."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from credo.algos import AGG_MODES, POLICY_LOSSES, ppo, register_policy_loss, per_token_policy_loss
from credo.algos.policy_losses import cispo, gspo, reinforce, sapo, topr
from tests.algos._inputs import COMMON_CORRECTIONS, grad_of, make_policy_inputs
from tests.reference_registry import REFERENCES, extra_kwargs, load_registries

load_registries()
LOSS_NAMES = sorted(POLICY_LOSSES)
SHAPES = [(1, 1), (3, 5), (4, 7), (2, 9)]


@pytest.mark.parametrize("correction", sorted(COMMON_CORRECTIONS))
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_matches_naive_reference(name, correction):
    """Loss value and gradient vs the naive reference; each shape uses another aggregation mode
    (all four per correction), with and without weights and global counts."""
    ref = REFERENCES.get(("policy_loss", name))
    if ref is None:
        pytest.fail(f"no naive reference for policy loss {name!r} (see test_reference_coverage)")
    fn = POLICY_LOSSES[name]
    seed = zlib.crc32(f"{name}/{correction}".encode()) % 10_000
    g = torch.Generator().manual_seed(seed)
    for i, (B, T) in enumerate(SHAPES):
        use_weights = (i + seed) % 2 == 0
        lp, old, adv, mask, common = make_policy_inputs(B, T, g, weights=use_weights, rollout=correction != "none")
        common.update(COMMON_CORRECTIONS[correction])
        common["agg_mode"] = AGG_MODES[(i + seed) % len(AGG_MODES)]
        if (i + seed // 2) % 2:
            common["global_tokens"] = int(mask.sum()) + 3
            common["global_seqs"] = int(mask.any(-1).sum()) + 1
            common["norm_len"] = T + 2
        kwargs = extra_kwargs("policy_loss", name, B, T, g)
        mask_arg = mask.double() if i == 2 else mask  # 0/1 float masks are accepted
        loss, metrics = fn(lp, old, adv, mask_arg, **common, **kwargs)
        expected = ref(lp, old, adv, mask, **common, **kwargs)
        torch.testing.assert_close(loss, torch.as_tensor(expected, dtype=loss.dtype), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(grad_of(loss, lp), grad_of(torch.as_tensor(expected), lp), rtol=1e-9, atol=1e-12)
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), metrics


def test_ppo_hand_worked_dual_clip():
    # One token, A = -1, log-ratio 2 (r = e^2 ~ 7.39), clip 0.2, dual clip c = 3:
    # unclipped -A r = 7.39, clipped -A 1.2 = 1.2, max = 7.39; dual clip min(7.39, 3 * 1) = 3.
    lp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-2.0]])
    adv = torch.tensor([[-1.0]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, metrics = ppo(lp, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)
    assert grad_of(loss, lp).item() == 0.0
    assert metrics["dual_clipfrac"].item() == 1.0
    # Without the dual clip the loss is the unbounded -A r = e^2 with gradient e^2.
    loss, _ = ppo(lp, old, adv, mask)
    assert loss.item() == pytest.approx(math.exp(2))
    assert grad_of(loss, lp).item() == pytest.approx(math.exp(2))


def test_ppo_clipfrac_metrics_count_active_clips():
    g = torch.Generator().manual_seed(0)
    lp, old, adv, mask, _ = make_policy_inputs(6, 8, g, log_ratio_scale=0.5)
    _, metrics = ppo(lp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    low = high = n = 0
    for b in range(6):
        for t in range(8):
            if mask[b, t]:
                r = math.exp(float(lp[b, t].detach() - old[b, t]))
                n += 1
                low += adv[b, t] < 0 and r < 0.9
                high += adv[b, t] > 0 and r > 1.3
    assert low > 0 and high > 0
    assert metrics["clipfrac_low"].item() == pytest.approx(low / n)
    assert metrics["clipfrac_high"].item() == pytest.approx(high / n)
    ratios = [math.exp(float(lp[b, t].detach() - old[b, t])) for b in range(6) for t in range(8) if mask[b, t]]
    assert metrics["ratio_max"].item() == pytest.approx(max(ratios))
    assert metrics["ratio_min"].item() == pytest.approx(min(ratios))
    assert metrics["ratio_mean"].item() == pytest.approx(sum(ratios) / n)


def test_gspo_gradient_equals_sequence_level_objective():
    # With one advantage per sequence and seq-mean-token-mean, GSPO-token has the gradient of
    # sequence-level GSPO: J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log-ratio).
    g = torch.Generator().manual_seed(1)
    lp, old, _, mask, _ = make_policy_inputs(5, 6, g, log_ratio_scale=0.2)
    mask[:, 0] = True
    seq_adv = torch.randn(5, generator=g, dtype=torch.float64)
    adv = seq_adv[:, None].expand(5, 6).clone()
    loss, _ = gspo(lp, old, adv, mask, clip_low=0.05, clip_high=0.05, agg_mode="seq-mean-token-mean")
    objective = 0.0
    for b in range(5):
        ts = [t for t in range(6) if mask[b, t]]
        s = torch.exp(sum(lp[b, t] - old[b, t] for t in ts) / len(ts))
        objective = objective + torch.minimum(s * seq_adv[b], s.clamp(0.95, 1.05) * seq_adv[b])
    torch.testing.assert_close(grad_of(loss, lp), grad_of(-objective / 5, lp))


def test_cispo_keeps_gradient_where_ppo_clips():
    lp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0]], dtype=torch.float64)  # r = e ~ 2.72
    adv = torch.ones(1, 1, dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    ppo_loss, _ = ppo(lp, old, adv, mask)
    cispo_loss, metrics = cispo(lp, old, adv, mask, clip_high=0.5)
    assert grad_of(ppo_loss, lp).item() == 0.0
    # CISPO: gradient of -sg(clip(r)) A log pi = -1.5 * 1 * d(log pi)
    assert grad_of(cispo_loss, lp).item() == pytest.approx(-1.5)
    assert metrics["clipfrac_high"].item() == 1.0


def test_sapo_gradient_is_reinforce_gradient_on_policy_and_decays_off_policy():
    g = torch.Generator().manual_seed(2)
    lp, _, adv, mask, _ = make_policy_inputs(3, 4, g)
    on_policy = lp.detach().clone()
    sapo_loss, metrics = sapo(lp, on_policy, adv, mask)
    reinforce_loss, _ = reinforce(lp, on_policy, adv, mask)
    # at r = 1 the gate's weight 4 sigma(0)(1 - sigma(0)) = 1: d(-f(r)A) = -A dr = -A r dlog pi
    reinforce_grad = grad_of(reinforce_loss, lp)
    torch.testing.assert_close(grad_of(sapo_loss, lp), reinforce_grad)
    assert metrics["gate_weight_mean"].item() == pytest.approx(1.0)
    far = lp.detach() - 3.0  # r = e^3: weight 4 sigma(x)(1 - sigma(x)) with x = tau (e^3 - 1), tiny
    sapo_far, _ = sapo(lp, far, adv, mask)
    assert grad_of(sapo_far, lp).abs().max() < 1e-3 * reinforce_grad.abs().max()


def test_topr_without_scores_uses_sign_of_sequence_advantage():
    g = torch.Generator().manual_seed(3)
    lp, old, adv, mask, _ = make_policy_inputs(6, 5, g)
    scores = (torch.where(mask, adv, 0.0).sum(-1) > 0).double()
    a, _ = topr(lp, old, adv, mask)
    b, metrics = topr(lp, old, adv, mask, scores=scores)
    torch.testing.assert_close(a, b)
    nonempty = mask.any(-1)
    assert metrics["positive_frac"].item() == pytest.approx(float((scores.bool() & nonempty).sum() / nonempty.sum()))


def test_decoupled_ppo_is_ppo_times_capped_old_over_rollout_weight():
    g = torch.Generator().manual_seed(4)
    lp, old, adv, mask, kw = make_policy_inputs(4, 6, g, rollout=True)
    rollout = kw["rollout_log_probs"]
    corrected, metrics = ppo(lp, old, adv, mask, rollout_log_probs=rollout, correction="tis", correction_cap=1.1)
    manual, _ = ppo(lp, old, adv, mask, weights=torch.exp(old - rollout).clamp(max=1.1))
    torch.testing.assert_close(corrected, manual)
    torch.testing.assert_close(grad_of(corrected, lp), grad_of(manual, lp))
    assert 0 < metrics["is_ess"].item() <= 1


def test_correction_without_rollout_log_probs_raises():
    g = torch.Generator().manual_seed(5)
    lp, old, adv, mask, _ = make_policy_inputs(2, 3, g)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        ppo(lp, old, adv, mask, correction="tis")


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_weights_scale_the_per_token_loss(name):
    # Doubling every weight doubles the loss (the weights multiply the per-token loss).
    g = torch.Generator().manual_seed(6)
    lp, old, adv, mask, _ = make_policy_inputs(3, 4, g)
    kwargs = extra_kwargs("policy_loss", name, 3, 4, g)
    ones = torch.ones(3, 4, dtype=torch.float64)
    one, _ = POLICY_LOSSES[name](lp, old, adv, mask, weights=ones, **kwargs)
    two, _ = POLICY_LOSSES[name](lp, old, adv, mask, weights=2 * ones, **kwargs)
    plain, _ = POLICY_LOSSES[name](lp, old, adv, mask, **kwargs)
    torch.testing.assert_close(two, 2 * one)
    torch.testing.assert_close(one, plain)


def test_register_policy_loss_contract():
    @per_token_policy_loss
    def scaled_pg(log_probs, old_log_probs, advantages, mask, *, coef=1.0):
        return -coef * advantages * log_probs, {"coef": torch.tensor(coef)}

    register_policy_loss("_test_scaled_pg")(scaled_pg)
    try:
        assert POLICY_LOSSES["_test_scaled_pg"] is scaled_pg
        register_policy_loss("_test_scaled_pg")(scaled_pg)  # same function again: allowed
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("_test_scaled_pg")(reinforce)
        g = torch.Generator().manual_seed(7)
        lp, old, adv, mask, _ = make_policy_inputs(2, 3, g)
        loss, metrics = scaled_pg(lp, old, adv, mask, coef=2.0)
        base, _ = reinforce(lp, old, adv, mask)
        torch.testing.assert_close(loss, 2 * base)
        assert {"coef", "ratio_mean", "ratio_max", "ratio_min"} <= set(metrics)
    finally:
        POLICY_LOSSES.pop("_test_scaled_pg", None)


def test_cispo_clipfrac_counts_only_tokens_whose_weight_the_clip_changes():
    # A ratio exactly on a bound is not truncated: clamp(r, lo, hi) == r there.
    r_on_low = math.exp(-0.25)  # 1 - (1 - r) == r exactly (Sterbenz), so r sits on the lower bound
    log_r = torch.tensor([[-0.25, 0.0, -1.0, 0.5, 1.0]], dtype=torch.float64)
    old = torch.zeros(1, 5, dtype=torch.float64)
    lp = old + log_r
    adv = torch.ones(1, 5, dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    _, metrics = cispo(lp, old, adv, mask, clip_low=1 - r_on_low, clip_high=math.exp(0.5) - 1)
    ratios = [math.exp(x) for x in log_r[0].tolist()]
    low = sum(min(max(r, r_on_low), math.exp(0.5)) != r and r < 1 for r in ratios)
    high = sum(min(max(r, r_on_low), math.exp(0.5)) != r and r > 1 for r in ratios)
    assert (low, high) == (1, 1)  # e^-1 below, e^1 above; e^-0.25 and e^0.5 sit on the bounds
    assert metrics["clipfrac_low"].item() == pytest.approx(low / 5)
    assert metrics["clipfrac_high"].item() == pytest.approx(high / 5)


def test_topr_positive_frac_with_a_single_nonempty_sequence():
    lp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.ones(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    _, metrics = topr(lp, lp, adv, mask, scores=torch.tensor([1.0, 1.0], dtype=torch.float64))
    # one nonempty sequence, positive: 1 / 1 (the empty row counts in neither)
    assert metrics["positive_frac"].item() == 1.0


def test_topr_scores_are_checked_by_name():
    lp = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^scores has shape \[2, 1\], expected 1 dimensions$"):
        topr(lp, lp, lp, mask, scores=torch.ones(2, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^scores has shape \[3\], expected \[2\] like log_probs$"):
        topr(lp, lp, lp, mask, scores=torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^scores has non-finite values \(NaN or Inf\)$"):
        topr(lp, lp, lp, mask, scores=torch.tensor([1.0, float("nan")], dtype=torch.float64))


def test_ppo_clipfracs_count_only_tokens_whose_gradient_the_clip_zeroes():
    # ratios e^1 (above 1.2) and e^-1 (below 0.8) on advantages +1, 0 and -1: with A = 0 the surrogate is
    # 0 either way, so the clip changes nothing there and is not counted
    lp = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])
    old = torch.zeros(1, 6)
    adv = torch.tensor([[1.0, 0.0, -1.0, 1.0, 0.0, -1.0]])
    _, metrics = ppo(lp, old, adv, torch.ones(1, 6, dtype=torch.bool))
    assert metrics["clipfrac_high"].item() == pytest.approx(1 / 6)
    assert metrics["clipfrac_low"].item() == pytest.approx(1 / 6)


def test_ppo_dual_clip_must_exceed_one():
    lp, mask = torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool)
    for c in (1.0, 0.5):
        with pytest.raises(ValueError, match=rf"^dual_clip is {c!r}, expected a constant > 1 or None$"):
            ppo(lp, lp, lp, mask, dual_clip=c)
    ppo(lp, lp, lp, mask, dual_clip=1.0 + 1e-9)
