"""Helpers shared by the attention-based credit rules: top-fraction selection and sign handling."""

from __future__ import annotations

import math

import torch

SIGN_MODES = ("both", "positive", "negative")


def top_fraction_mask(
    scores: torch.Tensor, valid: torch.Tensor, fraction: float, *, largest: bool = True
) -> torch.Tensor:
    """Select the top ``fraction`` of the valid entries of each row of ``scores``.

    Ties are broken by position (earlier index first) through a stable sort, so the result is
    deterministic. NaN scores rank below every number.

    Args:
        scores: ``[..., N]`` float.
        valid: ``[..., N]`` bool, the entries that may be selected and that count for ``n``.
        fraction: share of the valid entries to select: the nearest integer to ``fraction * n``
            (halves round up), at least 1 when ``n > 0`` and ``fraction > 0``, at most ``n``. The
            papers say "top 40%" without a rounding rule.
        largest: select the largest (True) or the smallest (False) scores.

    Returns:
        ``[..., N]`` bool mask.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction={fraction}, expected a value in [0, 1]")
    key = scores if largest else -scores
    key = torch.where(valid & ~torch.isnan(key), key, torch.full_like(key, -math.inf))
    # Two stable sorts: by score (descending), then valid entries before invalid ones.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    valid_sorted = valid.gather(-1, order)
    by_valid = torch.sort(valid_sorted.to(torch.int8), dim=-1, descending=True, stable=True)
    order = order.gather(-1, by_valid.indices)
    ranks = torch.empty_like(order).scatter_(
        -1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order).contiguous()
    )
    n_valid = valid.sum(dim=-1, keepdim=True)
    counts = torch.floor(fraction * n_valid.double() + 0.5 + 1e-9).long()
    selectable = (n_valid > 0) & (fraction > 0)
    counts = torch.where(selectable, counts.clamp(min=1), torch.zeros_like(counts))
    counts = torch.minimum(counts, n_valid)
    return (ranks < counts) & valid


def apply_sign_mode(
    gamma: torch.Tensor, advantages: torch.Tensor | None, sign_mode: str
) -> torch.Tensor:
    """Reset multipliers to 1 on tokens whose advantage sign ``sign_mode`` excludes.

    ``"both"`` keeps all multipliers; ``"positive"`` keeps them where ``advantages >= 0`` (the
    "non-negative advantages" wording of arXiv 2510.13554 v1); ``"negative"`` where
    ``advantages < 0``.
    """
    if sign_mode not in SIGN_MODES:
        raise ValueError(f"sign_mode={sign_mode!r}, expected one of {SIGN_MODES}")
    if sign_mode == "both":
        return gamma
    if advantages is None:
        raise ValueError(f"sign_mode={sign_mode!r} needs advantages, got None")
    try:
        torch.broadcast_shapes(advantages.shape, gamma.shape)
    except RuntimeError:
        raise ValueError(
            f"advantages has shape {list(advantages.shape)}, expected {list(gamma.shape)} "
            "like the per-token scores"
        ) from None
    keep = advantages.detach() >= 0 if sign_mode == "positive" else advantages.detach() < 0
    return torch.where(keep, gamma, torch.ones_like(gamma))


def response_rows(response_mask: torch.Tensor | None, shape: torch.Size, device) -> torch.Tensor:
    """``response_mask`` as a bool tensor of ``shape`` (all True when None)."""
    if response_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if response_mask.shape != shape:
        raise ValueError(
            f"response_mask has shape {list(response_mask.shape)}, expected {list(shape)}"
        )
    return response_mask.bool()
