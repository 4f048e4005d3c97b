"""value_loss and mismatch_metrics at their boundaries: clip edges, ties, defaults, counts, dtypes, errors.

Expected values are worked by hand from the docstrings' formulas (binary fractions, so exact in float64).
"""

import math

import pytest
import torch

from credo.algos import value_loss
from credo.algos.mismatch import MISMATCH_METRICS, mismatch_metrics

F64 = torch.float64


def _one(v, v_old, r, **kwargs):
    values = torch.tensor([[v]], dtype=F64, requires_grad=True)
    loss, metrics = value_loss(values, torch.tensor([[v_old]], dtype=F64), torch.tensor([[r]], dtype=F64),
                               torch.ones(1, 1, dtype=torch.bool), **kwargs)  # fmt: skip
    (grad,) = torch.autograd.grad(loss, values)
    return loss.item(), metrics["vf_clipfrac"].item(), grad.item()


@pytest.mark.parametrize(
    "v, v_old, r, want_loss, want_clipfrac, want_grad",
    [
        # inside the band and exactly on its edge: V_clip = V, nothing clipped
        (0.125, 0.0, 1.0, 0.5 * 0.875**2, 0.0, -0.875),
        (0.25, 0.0, 1.0, 0.5 * 0.75**2, 0.0, -0.75),
        (-0.25, 0.0, -1.0, 0.5 * 0.75**2, 0.0, 0.75),
        # above the band, R beyond V: V_clip = 0.25 is farther from R, its error wins, no gradient to V
        (0.5, 0.0, 1.0, 0.5 * 0.75**2, 1.0, 0.0),
        # below the band, R beyond V: V_clip = -0.25
        (-0.5, 0.0, -1.0, 0.5 * 0.75**2, 1.0, 0.0),
        # above the band, R on V_old's side: the unclipped error is the larger
        (0.5, 0.0, 0.0, 0.5 * 0.25, 0.0, 0.5),
        # a tie: (0.5 - 0.375)^2 == (0.25 - 0.375)^2, not counted as clipped
        (0.5, 0.0, 0.375, 0.5 * 0.125**2, 0.0, None),
        # the band sits around V_old = 1: V = 0.5 is clipped up to 0.75, farther from R = 0
        (0.5, 1.0, 0.0, 0.5 * 0.75**2, 1.0, 0.0),
    ],
)
def test_value_clip_band_edges(v, v_old, r, want_loss, want_clipfrac, want_grad):
    loss, clipfrac, grad = _one(v, v_old, r, clip_range=0.25)
    assert loss == want_loss
    assert clipfrac == want_clipfrac
    if want_grad is not None:
        assert grad == want_grad


def test_value_loss_defaults_are_token_mean_over_all_tokens():
    # squared errors 1, 4 (row 0) and 16 (row 1): token-mean 0.5 * 21 / 3 (seq-mean would be 0.5 * (2.5 + 16) / 2)
    values = torch.tensor([[1.0, 2.0], [4.0, 9.0]], dtype=F64)
    zeros = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, metrics = value_loss(values, values, zeros, mask)  # old = values: never clipped
    assert loss.item() == pytest.approx(0.5 * 21 / 3)
    assert metrics["value_mean"].item() == pytest.approx(7 / 3)
    assert metrics["value_error"].item() == pytest.approx(21 / 3)
    assert metrics["vf_clipfrac"].item() == 0.0


def test_value_loss_global_counts_replace_the_local_ones():
    values = torch.tensor([[1.0, 2.0], [4.0, 9.0]], dtype=F64)
    zeros = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, _ = value_loss(values, values, zeros, mask, global_tokens=10)
    assert loss.item() == pytest.approx(0.5 * 21 / 10)
    loss, _ = value_loss(values, values, zeros, mask, agg_mode="seq-mean-token-mean", global_seqs=5)
    assert loss.item() == pytest.approx(0.5 * (2.5 + 16) / 5)
    loss, _ = value_loss(values, values, zeros, mask, agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.5 * (5 + 16) / 2)


def test_value_metrics_use_the_unclipped_error_and_ignore_masked_out_tokens():
    values = torch.tensor([[0.5, float("nan")]], dtype=F64, requires_grad=True)
    old = torch.tensor([[0.0, float("inf")]], dtype=F64, requires_grad=True)
    returns = torch.tensor([[1.0, float("nan")]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.25)
    assert loss.item() == 0.5 * 0.75**2  # the clipped error
    assert metrics["value_error"].item() == 0.25  # (0.5 - 1)^2, unclipped
    assert metrics["value_mean"].item() == 0.5
    assert not any(m.requires_grad for m in metrics.values())
    # old values and returns are constants of the loss; masked-out values get a zero gradient
    grads = torch.autograd.grad(loss, (values, old, returns), allow_unused=True)
    assert grads[0].tolist() == [[0.0, 0.0]] and grads[1] is None and grads[2] is None
    loss, _ = value_loss(values, old, returns, mask, clip_range=1.0)
    grads = torch.autograd.grad(loss, (values, old, returns), allow_unused=True)
    assert grads[0].tolist() == [[-0.5, 0.0]] and grads[1] is None and grads[2] is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_value_metrics_dtypes_follow_the_accumulation_dtype(dtype):
    want = torch.float64 if dtype == torch.float64 else torch.float32
    values, mask = torch.ones(1, 2, dtype=dtype), torch.ones(1, 2, dtype=torch.bool)
    for clip in (None, 0.2):
        loss, metrics = value_loss(values, values, values, mask, clip_range=clip)
        assert loss.dtype == want and loss.shape == ()
        for name, m in metrics.items():
            assert m.dtype == want and m.shape == (), name
        assert metrics["vf_clipfrac"].item() == 0.0


def test_value_loss_names_its_bad_arguments():
    values, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^values has dtype torch.int64, expected a floating dtype$"):
        value_loss(values.long(), values, values, mask)
    with pytest.raises(ValueError, match=r"^old_values has shape \[1, 3\], expected \[1, 2\] like values$"):
        value_loss(values, torch.zeros(1, 3), values, mask)
    with pytest.raises(ValueError, match=r"^old_values has dtype torch.int64, expected a floating dtype$"):
        value_loss(values, values.long(), values, mask)
    with pytest.raises(ValueError, match=r"^returns has shape \[2, 2\], expected \[1, 2\] like values$"):
        value_loss(values, values, torch.zeros(2, 2), mask)
    with pytest.raises(ValueError, match=r"^returns has dtype torch.int64, expected a floating dtype$"):
        value_loss(values, values, values.long(), mask)
    with pytest.raises(ValueError, match=r"^mask has shape \[2\], expected \[1, 2\] like values$"):
        value_loss(values, values, values, torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^agg_mode is 'mean', expected one of \['token-mean', "):
        value_loss(values, values, values, mask, agg_mode="mean")


# ---- mismatch_metrics


def test_mismatch_metric_names():
    assert MISMATCH_METRICS == (
        "mismatch/k3", "mismatch/log_ratio_p1", "mismatch/log_ratio_p50", "mismatch/log_ratio_p99",
        "mismatch/ess", "mismatch/max_ratio",
    )  # fmt: skip
    got = mismatch_metrics(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    assert list(got) == list(MISMATCH_METRICS)


def test_mismatch_quantiles_interpolate_between_sorted_log_ratios():
    # 101 log-ratios 0..100 in shuffled order: the quantiles fall on order statistics 1, 50 and 99
    d = torch.randperm(101, generator=torch.Generator().manual_seed(0)).to(F64).reshape(1, 101)
    got = mismatch_metrics(d, torch.zeros_like(d), torch.ones(1, 101, dtype=torch.bool))
    assert (got["mismatch/log_ratio_p1"], got["mismatch/log_ratio_p50"], got["mismatch/log_ratio_p99"]) == (
        1.0, 50.0, 99.0,
    )  # fmt: skip
    # two log-ratios 0 and 1: positions 0.01, 0.5, 0.99 between them
    pi = torch.tensor([[1.0, 0.0]], dtype=F64)
    got = mismatch_metrics(pi, torch.zeros_like(pi), torch.ones(1, 2, dtype=torch.bool))
    assert got["mismatch/log_ratio_p1"] == pytest.approx(0.01)
    assert got["mismatch/log_ratio_p50"] == pytest.approx(0.5)
    assert got["mismatch/log_ratio_p99"] == pytest.approx(0.99)
    # one token: every quantile is its log-ratio
    got = mismatch_metrics(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool))
    assert [got[k] for k in MISMATCH_METRICS[1:4]] == [-0.5, -0.5, -0.5]


def test_mismatch_k3_and_ess_use_the_clamped_ratio():
    pi = torch.tensor([[25.0, 0.0]], dtype=F64)
    got = mismatch_metrics(pi, torch.zeros_like(pi), torch.ones(1, 2, dtype=torch.bool))
    e20 = math.exp(20)
    assert got["mismatch/k3"] == pytest.approx((e20 - 1 - 20) / 2)
    assert got["mismatch/ess"] == pytest.approx((e20 + 1) ** 2 / (2 * (e20 * e20 + 1)))
    assert got["mismatch/max_ratio"] == pytest.approx(e20)
    assert got["mismatch/log_ratio_p99"] == pytest.approx(0.99 * 25)
    pi = torch.tensor([[-25.0]], dtype=F64)
    got = mismatch_metrics(pi, torch.zeros_like(pi), torch.ones(1, 1, dtype=torch.bool))
    assert got["mismatch/k3"] == pytest.approx(math.exp(-20) - 1 + 20)
    assert got["mismatch/max_ratio"] == pytest.approx(math.exp(-20))


def test_mismatch_metrics_run_in_float64_on_float32_inputs():
    # d = 1e-4 for every token: in float32, exp(d) - 1 - d loses the 5e-9 k3 to rounding
    pi = torch.full((1, 4), -1.0, dtype=torch.float32)
    mu = pi - 1e-4
    got = mismatch_metrics(pi, mu, torch.ones(1, 4, dtype=torch.bool))
    d = float(pi[0, 0].double() - mu[0, 0].double())
    assert got["mismatch/k3"] == pytest.approx(math.exp(d) - 1 - d, rel=1e-6)


def test_mismatch_ignores_non_finite_values_outside_the_mask():
    pi = torch.tensor([[math.log(2.0), float("nan")]], dtype=F64)
    mu = torch.tensor([[0.0, float("-inf")]], dtype=F64)
    got = mismatch_metrics(pi, mu, torch.tensor([[1.0, 0.0]]))
    assert got["mismatch/max_ratio"] == pytest.approx(2.0) and got["mismatch/ess"] == 1.0
    assert got["mismatch/log_ratio_p50"] == pytest.approx(math.log(2.0))


def test_mismatch_metrics_name_their_bad_arguments():
    lp, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^trainer_log_probs has shape \[2\], expected 2 dimensions$"):
        mismatch_metrics(torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^sampler_log_probs has shape \[1, 3\], expected \[1, 2\] like trainer_log_probs$"):
        mismatch_metrics(lp, torch.zeros(1, 3), mask)
    with pytest.raises(ValueError, match=r"^sampler_log_probs has dtype torch.int64, expected a floating dtype$"):
        mismatch_metrics(lp, lp.long(), mask)
    with pytest.raises(ValueError, match=r"^mask has shape \[1, 3\], expected \[1, 2\] like trainer_log_probs$"):
        mismatch_metrics(lp, lp, torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^trainer_log_probs has non-finite values \(NaN or Inf\) in masked-in"):
        mismatch_metrics(torch.tensor([[0.0, float("inf")]]), lp, mask)
