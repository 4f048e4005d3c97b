"""aggregate() against loop references, and its split-invariance rule."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from credo.algos import AGG_MODES, aggregate, global_counts, masked_mean
from tests.algos._inputs import grad_of, make_mask
from tests.algos.naive_common import naive_aggregate

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _rows(values, mask):
    return [[values[b, t] if mask[b, t] else None for t in range(mask.shape[1])] for b in range(mask.shape[0])]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("global_counts_given", [False, True])
def test_matches_loop_reference(mode, global_counts_given):
    g = torch.Generator().manual_seed(AGG_MODES.index(mode))
    for B, T in [(1, 1), (3, 4), (5, 8)]:
        values = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
        mask = make_mask(B, T, g)
        kw = {}
        if global_counts_given:
            kw = {"global_tokens": int(mask.sum()) + 2, "global_seqs": int(mask.any(-1).sum()) + 1, "norm_len": 11}
        got = aggregate(values, mask, mode, **kw)
        expected = naive_aggregate(_rows(values, mask), mask, mode, **kw)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(grad_of(got, values), grad_of(expected, values))


def test_hand_worked_modes():
    # Row 0: tokens 1, 2, 3 (n=3); row 1: token 4 (n=1); row 2 empty.
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)  # empty row not counted
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / 3 / 2)  # norm_len = T = 3
    assert aggregate(values, mask, "seq-mean-token-sum-norm", norm_len=10).item() == pytest.approx(10 / 10 / 2)
    tokens, seqs = global_counts(mask)
    assert (tokens.item(), seqs.item()) == (4, 2)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_zero_mask_and_nonfinite_masked_out_values(mode):
    values = torch.full((3, 4), float("nan"), requires_grad=True)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    out = aggregate(values, mask, mode)
    assert out.item() == 0.0
    assert torch.equal(grad_of(out, values), torch.zeros(3, 4))
    # inf/nan outside the mask: finite result, zero gradient there
    raw = torch.tensor([[1.0, float("inf"), 2.0], [float("nan"), 3.0, -float("inf")]])
    values = raw.clone().requires_grad_()
    mask = torch.isfinite(raw)
    out = aggregate(values, mask, mode)
    grad = grad_of(out, values)
    assert torch.isfinite(out) and torch.isfinite(grad).all()
    assert torch.equal(grad[~mask], torch.zeros(3))


@st.composite
def split_case(draw):
    B = draw(st.integers(1, 7))
    T = draw(st.integers(1, 6))
    k = draw(st.integers(1, B))
    cuts = sorted(draw(st.lists(st.integers(1, max(B - 1, 1)), min_size=k - 1, max_size=k - 1, unique=True))) if B > 1 else []
    seed = draw(st.integers(0, 2**16))
    p_on = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    return B, T, [0, *cuts, B], seed, p_on


def micro_batches(bounds, *tensors, mask_index):
    """Yields row slices, each trimmed to its last masked-in column (dynamic padding)."""
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi <= lo:
            continue
        rows = [x[lo:hi] for x in tensors]
        m = rows[mask_index]
        used = m.any(0).nonzero()
        width = int(used.max()) + 1 if used.numel() else 1
        yield [x[:, :width] for x in rows], (lo, hi, width)


@SETTINGS
@given(split_case(), st.sampled_from(AGG_MODES))
def test_split_invariance(case, mode):
    B, T, bounds, seed, p_on = case
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    mask = make_mask(B, T, g, p_on=p_on)
    tokens, seqs = global_counts(mask)
    kw = {"global_tokens": tokens, "global_seqs": seqs, "norm_len": T}
    full = aggregate(values, mask, mode, **kw)
    parts = sum(aggregate(v, m, mode, **kw) for (v, m), _ in micro_batches(bounds, values, mask, mask_index=1))
    torch.testing.assert_close(parts, full, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(grad_of(parts, values), grad_of(full, values), atol=1e-12, rtol=1e-9)


def test_validation_errors_name_the_argument():
    values = torch.zeros(4, 9)
    with pytest.raises(ValueError, match=r"mask has dtype torch.int64, expected bool or floating"):
        aggregate(values, torch.ones(4, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"mask has shape \[4, 7\], expected \[4, 9\] like values"):
        aggregate(values, torch.ones(4, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has values other than 0 and 1"):
        aggregate(values, torch.full((4, 9), 0.5))
    with pytest.raises(ValueError, match=r"mode is 'token-sum'"):
        aggregate(values, torch.ones(4, 9, dtype=torch.bool), "token-sum")
    with pytest.raises(ValueError, match=r"values has shape \[9\], expected 2 dimensions"):
        aggregate(torch.zeros(9), torch.ones(9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"global_tokens is 0, expected a positive number"):
        aggregate(values, torch.ones(4, 9, dtype=torch.bool), global_tokens=0)


def _fsum_reference(values, mask, mode, *, global_tokens=None, global_seqs=None, norm_len=None):
    """float64 reference with exactly rounded sums (math.fsum over Python floats)."""
    rows = [[v for v, on in zip(vals, ons) if on] for vals, ons in zip(values.double().tolist(), mask.tolist())]
    if mode == "token-mean":
        n = sum(len(r) for r in rows) if global_tokens is None else global_tokens
        return math.fsum(x for r in rows for x in r) / max(n, 1)
    per_seq = []
    for r in rows:
        if not r:
            continue
        s = math.fsum(r)
        if mode == "seq-mean-token-mean":
            s /= len(r)
        elif mode == "seq-mean-token-sum-norm":
            s /= values.shape[1] if norm_len is None else norm_len
        per_seq.append(s)
    n = len(per_seq) if global_seqs is None else global_seqs
    return math.fsum(per_seq) / max(n, 1)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_fp16_counts_above_65504_are_not_inf(mode):
    # A float16 count of 70,000 is inf (fp16 max 65,504): dividing by it gave a silent 0 loss.
    g = torch.Generator().manual_seed(11)
    values = torch.rand(2, 70_000, generator=g).to(torch.float16).requires_grad_()
    mask = torch.ones(2, 70_000, dtype=torch.bool)
    mask[1, 50_000:] = False
    got = aggregate(values, mask, mode)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(_fsum_reference(values, mask, mode), rel=1e-5)
    grad = grad_of(got, values)
    assert grad.dtype == torch.float16 and bool((grad[mask] > 0).all())
    if mode == "token-mean":  # d/dv of sum / 120,000, representable (subnormal) in fp16
        assert grad[0, 0].item() == pytest.approx(1 / 120_000, rel=1e-2)
    # a global count above the fp16 range with a small local micro-batch
    small, small_mask = values.detach()[:, :100], mask[:, :100]
    got = aggregate(small, small_mask, mode, global_tokens=70_000, global_seqs=3)
    expected = _fsum_reference(small, small_mask, mode, global_tokens=70_000, global_seqs=3)
    assert got.item() == pytest.approx(expected, rel=1e-5) and expected != 0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_bf16_count_3000_is_exact(mode):
    # bfloat16 keeps 8 significant bits: a count of 3000 cast to bf16 is 3008 (-0.27% bias).
    g = torch.Generator().manual_seed(12)
    values = (1 + torch.rand(1, 3000, generator=g)).to(torch.bfloat16)
    mask = torch.ones(1, 3000, dtype=torch.bool)
    got = aggregate(values, mask, mode)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(_fsum_reference(values, mask, mode), rel=1e-6)
    assert masked_mean(values, mask).item() == pytest.approx(_fsum_reference(values, mask, "token-mean"), rel=1e-6)


def test_fp16_masked_mean_and_dtypes_kept_for_fp32_fp64():
    values = torch.full((1, 70_000), 0.25, dtype=torch.float16)
    mask = torch.ones(1, 70_000, dtype=torch.bool)
    assert masked_mean(values, mask).item() == 0.25
    for dtype in (torch.float32, torch.float64):
        x = torch.rand(3, 4, dtype=dtype)
        m = torch.rand(3, 4) < 0.7
        assert masked_mean(x, m).dtype == dtype
        assert all(aggregate(x, m, mode).dtype == dtype for mode in AGG_MODES)


@pytest.mark.parametrize("mask, message", [
    (torch.ones(3, dtype=torch.bool), r"^mask has shape \[3\], expected 2 dimensions$"),
    (torch.ones(1, 2, 3, dtype=torch.bool), r"^mask has shape \[1, 2, 3\], expected 2 dimensions$"),
    (torch.ones(2, 3, dtype=torch.long), r"^mask has dtype torch.int64, expected bool or floating"),
    ([[1, 0]], r"^mask must be a torch.Tensor, got list$"),
])
def test_global_counts_names_the_bad_mask(mask, message):
    with pytest.raises(ValueError, match=message):
        global_counts(mask)


@pytest.mark.parametrize("kwargs, message", [
    ({"global_seqs": 0}, r"^global_seqs is 0, expected a positive number$"),
    ({"global_tokens": -2}, r"^global_tokens is -2, expected a positive number$"),
    ({"norm_len": 0.0}, r"^norm_len is 0.0, expected a positive number$"),
])
def test_aggregate_names_a_bad_count(kwargs, message):
    mode = "seq-mean-token-sum-norm" if "norm_len" in kwargs else "token-mean"
    with pytest.raises(ValueError, match=message):
        aggregate(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), mode, **kwargs)


def test_aggregate_rejects_integer_values():
    with pytest.raises(ValueError, match=r"^values has dtype torch.int64, expected a floating dtype$"):
        aggregate(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))


def test_masked_mean_of_a_single_token_is_its_value():
    values = torch.tensor([[3.0, 7.0], [5.0, 11.0]])
    mask = torch.tensor([[False, True], [False, False]])
    assert masked_mean(values, mask).item() == 7.0
    assert masked_mean(values, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0
