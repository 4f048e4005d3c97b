"""Simulated e4m3 quantisation against hand-computed values and a pure-Python enumeration of all
256 e4m3 codes (independent of torch.float8_e4m3fn and of the library's frexp arithmetic)."""

from __future__ import annotations

import math

import pytest
import torch

from credo.distributed.fp8 import E4M3_MAX, e4m3_channel_scales, quantize_e4m3, round_to_e4m3


def e4m3_code_value(code: int) -> float:
    """Value of an 8-bit e4m3fn code: sign | 4 exponent bits (bias 7) | 3 mantissa bits."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * (m / 8) * 2.0**-6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


ALL_CODES = [(code, e4m3_code_value(code)) for code in range(256)]
POSITIVE = sorted((v, code) for code, v in ALL_CODES if code < 0x80 and not math.isnan(v))


def naive_round(x: float) -> float:
    """Nearest e4m3 value by brute force over the codes; ties to the even code (= even mantissa)."""
    a = min(abs(x), 448.0)
    value, _ = min(POSITIVE, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return math.copysign(value, x)


def rounded(values, dtype=torch.float64):
    return round_to_e4m3(torch.tensor(values, dtype=dtype)).tolist()


def test_code_table_is_e4m3fn():
    finite = [v for _, v in ALL_CODES if not math.isnan(v)]
    assert len(finite) == 254  # 0x7F and 0xFF are NaN, no infinities
    assert max(finite) == 448.0 and min(finite) == -448.0
    assert min(v for v in finite if v > 0) == 2.0**-9
    assert len(POSITIVE) == 127 and len({v for v, _ in POSITIVE}) == 127


HAND = [
    # near 1.0: neighbours 0.9375 (2^-1 * 1.875), 1.0, 1.125
    (1.0, 1.0), (1.06, 1.0), (1.07, 1.125), (0.96, 0.9375), (0.97, 1.0), (1.124, 1.125),
    # ties to even mantissa: 1.0625 between 1.0 (m=0) and 1.125 (m=1); 1.1875 between m=1 and 1.25 (m=2);
    # 0.96875 between 0.9375 (m=7) and 1.0 (next binade, m=0)
    (1.0625, 1.0), (1.1875, 1.25), (0.96875, 1.0), (-1.0625, -1.0),
    # 0.1 lies in [2^-4, 2^-3) with spacing 2^-7: 12.8 * 2^-7 -> 13 * 2^-7
    (0.1, 0.1015625), (-0.1, -0.1015625),
    # subnormals: spacing 2^-9 below 2^-6
    (2.0**-9, 2.0**-9), (1.4 * 2.0**-10, 2.0**-9), (2.0**-10, 0.0), (3 * 2.0**-10, 2.0**-8),
    (0.6 * 2.0**-10, 0.0), (2.0**-6, 2.0**-6), (15 * 2.0**-10, 2.0**-6), (13 * 2.0**-10, 6 * 2.0**-9),
    # large values: spacing 32 in [256, 448]; 432 is the tie 416 (m=5) / 448 (m=6)
    (240.0, 240.0), (420.0, 416.0), (432.0, 448.0), (300.0, 288.0),
    # saturation (no inf): everything above 448 maps to 448
    (448.0, 448.0), (449.0, 448.0), (464.0, 448.0), (1e6, 448.0), (-1e30, -448.0),
    (0.0, 0.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hand_computed_values(dtype):
    xs, expected = zip(*HAND)
    got = rounded(list(xs), dtype)
    assert got == list(expected)
    assert [naive_round(x) for x in xs] == list(expected)  # the reference agrees with the hand values


def test_every_code_is_a_fixed_point_and_midpoints_round_to_even():
    finite = [v for _, v in ALL_CODES if not math.isnan(v)]
    assert rounded(finite) == finite
    # negative zero keeps its sign
    assert math.copysign(1.0, rounded([-0.0])[0]) == -1.0
    mids, expected = [], []
    for (lo, lo_code), (hi, hi_code) in zip(POSITIVE, POSITIVE[1:]):
        mids.append((lo + hi) / 2)
        expected.append(lo if lo_code % 2 == 0 else hi)
    assert rounded(mids) == expected
    assert rounded([-m for m in mids]) == [-e for e in expected]


def test_random_values_match_brute_force_enumeration():
    g = torch.Generator().manual_seed(0)
    # log-uniform magnitudes from 2^-12 to 2^10 (subnormals, normals, saturation), random signs
    mags = torch.exp2(-12 + 22 * torch.rand(3000, generator=g, dtype=torch.float64))
    x = torch.where(torch.rand(3000, generator=g) < 0.5, -mags, mags)
    assert rounded(x.tolist()) == [naive_round(v) for v in x.tolist()]


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch has no float8_e4m3fn")
def test_agrees_with_torch_float8_cast_in_range():
    g = torch.Generator().manual_seed(1)
    x = torch.exp2(-11 + 19.8 * torch.rand(5000, generator=g)) * torch.sign(torch.randn(5000, generator=g))
    assert bool((x.abs() <= E4M3_MAX).all())
    torch.testing.assert_close(round_to_e4m3(x), x.to(torch.float8_e4m3fn).float(), rtol=0, atol=0)


def test_quantize_per_channel_scales():
    w = torch.tensor(
        [
            [448.0, 1.0625, 0.1, -300.0],  # amax 448: scale 1, values rounded as they are
            [896.0, 2.125, -0.2, 2.0**-8],  # amax 896: scale 2; 2.125/2 = 1.0625 -> 1.0 -> 2.0
            [0.0, 0.0, 0.0, 0.0],  # zero channel: stays 0, no NaN
            [-3.0, 1.0, 0.5, 0.25],  # amax 3: scale 3/448
        ],
        dtype=torch.float64,
    )
    q = quantize_e4m3(w)
    assert q[0].tolist() == [448.0, 1.0, 0.1015625, -288.0]
    # -0.2/2 = -0.1 -> -0.1015625 -> * 2; 2^-8 / 2 = 2^-9 (smallest subnormal) -> exact
    assert q[1].tolist() == [896.0, 2.0, -0.203125, 2.0**-8]
    assert q[2].tolist() == [0.0, 0.0, 0.0, 0.0]
    s = 3 / 448
    assert q[3].tolist() == pytest.approx([naive_round(v / s) * s for v in (-3.0, 1.0, 0.5, 0.25)], rel=1e-15)
    assert q[3, 0].item() == -3.0  # each channel's amax is exact
    assert e4m3_channel_scales(w).flatten().tolist() == pytest.approx([1.0, 2.0, 1.0, s])
    assert torch.isfinite(q).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_quantize_keeps_shape_dtype_and_relative_error(dtype):
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(6, 5, 4, generator=g) * torch.exp2(torch.arange(6.0) - 3)[:, None, None]).to(dtype)
    w[3] = 0
    q = quantize_e4m3(w, channel_dim=0)
    assert q.shape == w.shape and q.dtype == dtype and torch.isfinite(q).all()
    wd, qd = w.double(), q.double()
    scale = wd.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-300) / 448
    normal = wd.abs() / scale >= 2.0**-6
    # round to nearest: relative error at most half a mantissa step (2^-4), plus the output dtype's rounding
    tol = 2.0**-4 + (2.0**-7 if dtype == torch.bfloat16 else 2.0**-10)
    assert bool(((qd - wd).abs() <= tol * wd.abs())[normal].all())
    assert bool((qd[3] == 0).all())


def test_channel_dim_selects_the_scale_axis():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 7, generator=g) * torch.linspace(0.01, 50, 7)
    torch.testing.assert_close(quantize_e4m3(w, channel_dim=1), quantize_e4m3(w.T, channel_dim=0).T, rtol=0, atol=0)
    torch.testing.assert_close(quantize_e4m3(w, channel_dim=-1), quantize_e4m3(w, channel_dim=1), rtol=0, atol=0)
    assert not torch.equal(quantize_e4m3(w, channel_dim=0), quantize_e4m3(w, channel_dim=1))
    # a 1-D tensor has one element per channel: every nonzero value is its channel's amax, kept exactly
    v = torch.tensor([0.3, -7.0, 0.0, 1e-3])
    assert quantize_e4m3(v).tolist() == v.tolist()


def test_quantize_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^channel_dim is 2, expected an int in \[-2, 2\)"):
        quantize_e4m3(torch.ones(2, 3), channel_dim=2)
    with pytest.raises(ValueError, match=r"^weight has non-finite"):
        quantize_e4m3(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match=r"^weight must be a floating"):
        quantize_e4m3(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^weight has shape \[\]"):
        quantize_e4m3(torch.tensor(1.0))
