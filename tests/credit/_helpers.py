"""Random inputs shared by the credit tests."""

from __future__ import annotations

import torch


def random_attention(*lead, n, seed):
    """Causal row-stochastic maps ``[*lead, n, n]`` (float64) from random logits."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*lead, n, n, generator=g, dtype=torch.float64) * 2
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return logits.softmax(-1)


def random_qk(*lead, heads, kv_heads, n, d, seed, dtype=torch.float64):
    """Query/key states ``[*lead, heads, n, d]`` and ``[*lead, kv_heads, n, d]``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, heads, n, d, generator=g, dtype=dtype)
    k = torch.randn(*lead, kv_heads, n, d, generator=g, dtype=dtype)
    return q, k
