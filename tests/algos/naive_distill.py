"""Naive references of on-policy distillation (credo.algos.distill): Python floats and loops over rows and tokens."""

from __future__ import annotations

import torch

from tests.algos.naive_common import masked_positions, naive_aggregate
from tests.reference_registry import reference


@reference("function", "reverse_kl_log_ratio")
def reverse_kl_log_ratio(student_log_probs, teacher_log_probs, mask):
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in masked_positions(mask, b):
            out[b, t] = float(student_log_probs[b, t]) - float(teacher_log_probs[b, t])
    return out


@reference("function", "distill_advantages")
def distill_advantages(student_log_probs, teacher_log_probs, mask, *, discount=0.0):
    """A_t = -(d_t + g d_t' + g^2 d_t'' ...) over the row's later masked tokens t < t' < t'' ..., written forwards."""
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        ts = masked_positions(mask, b)
        for i, t in enumerate(ts):
            total = 0.0
            for j, k in enumerate(ts[i:]):
                d = float(student_log_probs[b, k]) - float(teacher_log_probs[b, k])
                total += (discount ** j if j else 1.0) * d  # 0 ** 0 is 1: the token itself always counts
            out[b, t] = -total
    return out


@reference("function", "mix_advantages")
def mix_advantages(outcome, distill, weight):
    B, T = outcome.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            out[b, t] = (1.0 - weight) * float(outcome[b, t]) + weight * float(distill[b, t])
    return out


@reference("function", "distill_kl_loss")
def distill_kl_loss(log_probs, teacher_log_probs, mask, *, agg_mode="token-mean", global_tokens=None,
                    global_seqs=None, norm_len=None):
    B, T = mask.shape
    rows = [[None] * T for _ in range(B)]
    for b in range(B):
        for t in masked_positions(mask, b):
            d = log_probs[b, t] - float(teacher_log_probs[b, t])  # differentiable through log_probs
            rows[b][t] = 0.5 * d * d
    return naive_aggregate(rows, mask, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                           norm_len=norm_len)
