"""Clipped value (critic) loss of PPO."""

from __future__ import annotations

import torch

from credo.algos._validate import as_bool_mask, check_choice, check_finite, check_like, check_tensor, masked_fill_zero
from credo.algos.aggregation import AGG_MODES, accumulation_dtype, aggregate, masked_mean


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float | None = 0.2,
    agg_mode: str = "token-mean",
    global_tokens=None,
    global_seqs=None,
    norm_len: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO value loss with value clipping (arXiv 1707.06347; as verl/ROLL/OpenRLHF)::

        V_clip = clip(V, V_old - clip_range, V_old + clip_range)
        l_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)           (0.5 (V - R)^2 if clip_range is None)

    ``V`` itself is clamped, as verl does: the algebraically equal ``V_old + clip(V - V_old)``
    does not give back ``V`` exactly in floating point (fp32: ``V = -0.03``, ``V_old = 0.04``), so
    ``vf_clipfrac`` would count rounding error as clipping. Inside the band ``V_clip`` is ``V``
    bit for bit and the token is not counted.

    Args:
        values: ``[B, T]`` current critic values (with grad).
        old_values: ``[B, T]`` critic values at rollout time.
        returns: ``[B, T]`` targets (e.g. the ``returns`` of :func:`credo.algos.advantages.gae`).
        mask: ``[B, T]`` bool or 0/1 floating.
        clip_range: value clip, or None for the unclipped squared error.
        agg_mode, global_tokens, global_seqs, norm_len: see :func:`credo.algos.aggregation.aggregate`.

    Returns:
        ``(loss, metrics)`` with ``vf_clipfrac`` (share of masked tokens where the clipped error is
        strictly the larger), ``value_mean`` and ``value_error`` (token mean of (V - R)^2). The
        loss and metrics follow :func:`credo.algos.aggregation.aggregate`'s dtype rule (float32
        for float16/bfloat16 values).
    """
    check_tensor("values", values, ndim=2, floating=True)
    check_like("old_values", old_values, "values", values)
    check_like("returns", returns, "values", values)
    m = as_bool_mask(mask, "values", values)
    check_choice("agg_mode", agg_mode, AGG_MODES)
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_finite(name, x, m)
    v = masked_fill_zero(values, m)
    v_old = masked_fill_zero(old_values.detach(), m)
    ret = masked_fill_zero(returns.detach(), m)
    err = (v - ret) ** 2
    if clip_range is None:
        per_token = err
        clipfrac = torch.zeros((), dtype=accumulation_dtype(v.dtype), device=v.device)
    else:
        v_clip = torch.clamp(v, v_old - clip_range, v_old + clip_range)
        err_clip = (v_clip - ret) ** 2
        per_token = torch.maximum(err, err_clip)
        clipfrac = masked_mean((err_clip > err).to(v.dtype), m).detach()
    loss = aggregate(0.5 * per_token, m, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)
    metrics = {
        "vf_clipfrac": clipfrac,
        "value_mean": masked_mean(v.detach(), m),
        "value_error": masked_mean(err.detach(), m),
    }
    return loss, metrics
