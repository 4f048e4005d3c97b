"""Naive references of the AsyPPO helpers: Python dicts, lists, loops over tokens and sorted()."""

from __future__ import annotations

import math
from decimal import Decimal

import torch

from tests.reference_registry import reference


@reference("function", "critic_shards")
def critic_shards(group_ids, num_critics):
    seen = {}  # group id -> samples of that group met so far in batch order
    out = []
    for g in group_ids.tolist():
        rank = seen.get(g, 0)
        seen[g] = rank + 1
        out.append(rank % num_critics)
    return torch.tensor(out, dtype=torch.long)


@reference("function", "asyppo_value_mean")
def asyppo_value_mean(values):
    M, B, T = values.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            out[b, t] = sum(float(values[m, b, t]) for m in range(M)) / M
    return out


def token_sigma(values, b, t):
    """Population std over critics of token (b, t), from Python floats. math.fsum rounds once, so
    the same critic values in another order give the same float (exact ties stay ties)."""
    xs = [float(values[m, b, t]) for m in range(values.shape[0])]
    mean = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / len(xs))


def share(frac, n):
    """floor(frac * n) with frac read as the decimal it prints as."""
    return int(Decimal(repr(float(frac))) * n)  # non-negative: int() truncates = floor


@reference("function", "asyppo_masks")
def asyppo_masks(values, mask, low_frac, high_frac):
    M, B, T = values.shape
    tokens = []  # (sigma, flat index, b, t) of every valid token
    for b in range(B):
        for t in range(T):
            if bool(mask[b, t]):
                tokens.append((token_sigma(values, b, t), b * T + t, b, t))
    tokens.sort()  # by sigma, then flat index
    n = len(tokens)
    k_low, k_high = share(low_frac, n), share(high_frac, n)
    adv_keep = [[bool(mask[b, t]) for t in range(T)] for b in range(B)]
    entropy_keep = [[bool(mask[b, t]) for t in range(T)] for b in range(B)]
    for _, _, b, t in tokens[:k_low]:
        adv_keep[b][t] = False
    for _, _, b, t in tokens[n - k_high:]:
        entropy_keep[b][t] = False
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.bool).reshape(B, T)  # noqa: E731
    return as_tensor(adv_keep), as_tensor(entropy_keep)
