"""Entropy of categorical distributions given by logits."""

from __future__ import annotations

import torch

from credo.algos._validate import check_tensor


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``H = -sum_v p_v log p_v`` over the last dimension, numerically stable.

    Computed from ``log_softmax`` (no overflow for large logits); entries with ``p_v = 0``
    (e.g. logits set to -inf to ban tokens) contribute 0 with a zero gradient instead of NaN.
    Upcast bf16 logits yourself if you need fp32 accuracy.

    Args:
        logits: ``[..., V]`` floating.

    Returns:
        ``[...]`` entropies in nats.
    """
    check_tensor("logits", logits, floating=True)
    if logits.dim() == 0:
        raise ValueError("logits has shape [], expected [..., V] with a vocabulary dimension")
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)
