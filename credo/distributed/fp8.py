"""Simulated FP8 (OCP e4m3, "e4m3fn") weight quantisation with per-channel scales.

Used to reproduce a high train/inference mismatch regime (MIPU, arXiv 2606.29526, rolls out with
FP8-quantised vLLM weights) without an FP8 engine: the sampler's weights are replaced by their
quantise-dequantise image. Pure torch, no dependency on ``torch.float8_e4m3fn``.

e4m3 (sign, 4 exponent bits with bias 7, 3 mantissa bits; OCP 8-bit floating point spec):

- normals ``(1 + m/8) * 2^(e - 7)`` for ``e = 1..15`` (``e = 15, m = 7`` is NaN, so the largest
  finite value is ``1.75 * 2^8 = 448``); no infinities;
- subnormals ``(m/8) * 2^-6`` for ``e = 0``, the smallest ``2^-9``.

Rounding is to nearest, ties to even mantissa; magnitudes above 448 saturate to 448 (vLLM's
per-channel FP8 path scales by ``amax / 448`` first, so only rounding error can exceed it).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
_MIN_NORMAL_EXP = -6  # 1 - bias
_MANTISSA_BITS = 3


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Rounds every element of ``x`` to the nearest e4m3 value (ties to even, saturating at ±448).

    Args:
        x: floating tensor of any shape, finite.

    Returns:
        A tensor like ``x`` (same dtype) holding e4m3 values. Float16/bfloat16 inputs are rounded
        in float32 (e4m3 values are exact in all of them); signs of zeros are kept.
    """
    work = x if x.dtype == torch.float64 else x.float()
    a = work.abs().clamp(max=E4M3_MAX)
    _, e = torch.frexp(a)  # a = f * 2^e with f in [0.5, 1), so floor(log2 a) = e - 1 (e = 0 for a = 0)
    exp = (e - 1).clamp(min=_MIN_NORMAL_EXP)  # below 2^-6 the grid is the subnormal one
    quantum = torch.ldexp(torch.ones_like(a), exp - _MANTISSA_BITS)
    # a / quantum is exact (power-of-two scaling); torch.round rounds half to even, and the even
    # multiple of the quantum is the even mantissa (also across the subnormal/normal boundary)
    q = (torch.round(a / quantum) * quantum).clamp(max=E4M3_MAX)
    return torch.copysign(q, work).to(x.dtype)


def e4m3_channel_scales(weight: torch.Tensor, channel_dim: int = 0) -> torch.Tensor:
    """Per-channel scales ``amax / 448`` (1 for all-zero channels), shaped to broadcast against
    ``weight`` (size 1 on every dimension but ``channel_dim``), in float64.

    Args:
        weight: floating tensor with at least one dimension, finite.
        channel_dim: the output-channel dimension (negative values count from the end).
    """
    _check_weight(weight, channel_dim)
    w = weight.detach().double().abs()
    dim = channel_dim % weight.dim()
    others = tuple(d for d in range(weight.dim()) if d != dim)
    amax = w.amax(dim=others, keepdim=True) if others else w
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_e4m3(weight: torch.Tensor, channel_dim: int = 0) -> torch.Tensor:
    """Quantise-dequantise ``weight`` to e4m3 with one scale per channel.

    ``scale_c = amax_c / 448`` over channel ``c`` (all dimensions but ``channel_dim``), then
    ``w_hat = round_to_e4m3(w / scale_c) * scale_c`` computed in float64 and returned in the
    dtype of ``weight``. An all-zero channel (``amax = 0``) gets scale 1 and stays 0 (no 0/0).
    The largest magnitude of each channel is reproduced exactly (up to the output dtype).

    Args:
        weight: floating tensor, e.g. ``[out_features, in_features]`` of a linear layer.
        channel_dim: dimension holding the output channels (default 0, as in ``nn.Linear``).

    Returns:
        A detached tensor with the shape and dtype of ``weight``.

    Raises:
        ValueError: ``weight`` not a floating tensor with at least one dimension, NaN/Inf in it,
            or ``channel_dim`` out of range (each named).
    """
    scale = e4m3_channel_scales(weight, channel_dim)
    w = weight.detach().double()
    return (round_to_e4m3(w / scale) * scale).to(weight.dtype)


def _check_weight(weight, channel_dim) -> None:
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        got = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a floating torch.Tensor, got {got}")
    if weight.dim() == 0:
        raise ValueError("weight has shape [], expected at least 1 dimension (the channels)")
    n = weight.dim()
    if isinstance(channel_dim, bool) or not isinstance(channel_dim, int) or not -n <= channel_dim < n:
        shape = "[" + ", ".join(str(s) for s in weight.shape) + "]"
        raise ValueError(f"channel_dim is {channel_dim!r}, expected an int in [{-n}, {n}) for weight {shape}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("weight has non-finite values (NaN or Inf)")
