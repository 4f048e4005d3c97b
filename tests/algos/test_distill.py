"""On-policy distillation (credo.algos.distill) against the naive loops of naive_distill.py, autograd and the exact
per-token reverse KL."""

from __future__ import annotations

import pytest
import torch

from credo import algos
from credo.algos import AGG_MODES
from tests.algos import naive_distill as naive


def _inputs(B=4, T=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    teacher = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    mask = torch.rand(B, T, generator=g) > 0.35
    mask[0] = False  # an empty row
    mask[1, 2] = False  # a gap inside a row (an env's tokens in a multi-turn row)
    mask[1, 1] = mask[1, 3] = True
    return student, teacher, mask


def test_log_ratio_matches_naive_and_ignores_values_off_the_mask():
    s, t, m = _inputs()
    s[~m] = float("nan")
    t[~m] = float("inf")
    got = algos.reverse_kl_log_ratio(s, t, m)
    torch.testing.assert_close(got, naive.reverse_kl_log_ratio(s, t, m))
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.9, 1.0])
def test_advantages_match_a_forward_loop(discount):
    s, t, m = _inputs(seed=1)
    got = algos.distill_advantages(s.requires_grad_(), t, m, discount=discount)
    assert not got.requires_grad
    torch.testing.assert_close(got, naive.distill_advantages(s.detach(), t, m, discount=discount))


def test_discount_zero_is_the_negative_log_ratio_token_by_token():
    s, t, m = _inputs(seed=2)
    adv = algos.distill_advantages(s, t, m)
    assert torch.equal(adv[m], (t - s)[m]) and torch.equal(adv[~m], torch.zeros_like(adv[~m]))


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_mix_matches_naive(weight):
    s, t, m = _inputs(seed=3)
    outcome = torch.randn(s.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    dis = algos.distill_advantages(s, t, m)
    torch.testing.assert_close(algos.mix_advantages(outcome, dis, weight), naive.mix_advantages(outcome, dis, weight))


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_loss_and_its_gradient_match_naive(agg_mode):
    s, t, m = _inputs(seed=5)
    a = s.clone().requires_grad_()
    b = s.clone().requires_grad_()
    got = algos.distill_kl_loss(a, t, m, agg_mode=agg_mode, norm_len=9)
    want = naive.distill_kl_loss(b, t, m, agg_mode=agg_mode, norm_len=9)
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_loss_gradcheck():
    s, t, m = _inputs(B=3, T=4, seed=6)
    assert torch.autograd.gradcheck(lambda x: algos.distill_kl_loss(x, t, m), (s.clone().requires_grad_(),))


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_micro_batch_losses_sum_to_the_full_batch_loss(agg_mode):
    s, t, m = _inputs(B=6, T=5, seed=7)
    tokens, seqs = algos.global_counts(m)
    full_x = s.clone().requires_grad_()
    full = algos.distill_kl_loss(full_x, t, m, agg_mode=agg_mode, global_tokens=tokens, global_seqs=seqs, norm_len=5)
    full.backward()
    for split in ([2, 4], [1, 2, 3], [6]):
        x = s.clone().requires_grad_()
        parts = [algos.distill_kl_loss(xs, ts, ms, agg_mode=agg_mode, global_tokens=tokens, global_seqs=seqs,
                                       norm_len=5)
                 for xs, ts, ms in zip(x.split(split), t.split(split), m.split(split))]
        total = sum(parts)
        total.backward()
        torch.testing.assert_close(total, full)
        torch.testing.assert_close(x.grad, full_x.grad)


def test_empty_mask_is_finite_with_zero_gradient():
    s, t, _ = _inputs(seed=8)
    m = torch.zeros(s.shape, dtype=torch.bool)
    x = s.clone().requires_grad_()
    loss = algos.distill_kl_loss(x, t, m)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))
    assert torch.equal(algos.distill_advantages(s, t, m, discount=0.5), torch.zeros_like(s))


def test_loss_term_gradient_is_the_exact_reverse_kl_gradient_in_expectation():
    """On-policy, E_{y ~ pi}[grad d(y)^2 / 2] over the whole vocabulary equals autograd of the exact per-token
    KL(pi || pi_T) = sum_v pi(v) (log pi(v) - log pi_T(v)); and the reward form's REINFORCE gradient
    grad[-A(y) log pi(y)] with A = -d (detached) is the same per sample."""
    g = torch.Generator().manual_seed(9)
    V = 6
    z = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    zt = torch.randn(V, generator=g, dtype=torch.float64)
    exact = (z.softmax(-1) * (z.log_softmax(-1) - zt.log_softmax(-1))).sum()
    (want,) = torch.autograd.grad(exact, z)
    expected = torch.zeros(V, dtype=torch.float64)
    probs = z.softmax(-1).detach()
    for y in range(V):  # the expectation over the sampled token, enumerated
        lp = z.log_softmax(-1)[y].reshape(1, 1)
        lt = zt.log_softmax(-1)[y].reshape(1, 1)
        mask = torch.ones(1, 1, dtype=torch.bool)
        (gk2,) = torch.autograd.grad(algos.distill_kl_loss(lp, lt, mask), z)
        adv = algos.distill_advantages(lp, lt, mask)
        (greinforce,) = torch.autograd.grad((-adv * z.log_softmax(-1)[y]).sum(), z)
        torch.testing.assert_close(gk2, greinforce)
        expected += probs[y] * gk2
    torch.testing.assert_close(expected, want)


def test_bad_arguments_name_themselves():
    s, t, m = _inputs()
    with pytest.raises(ValueError, match="discount"):
        algos.distill_advantages(s, t, m, discount=1.5)
    with pytest.raises(ValueError, match="weight"):
        algos.mix_advantages(s, s, -0.1)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        algos.reverse_kl_log_ratio(s, t[:, :3], m)
