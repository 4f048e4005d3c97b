"""Loop-based building blocks shared by the naive references (no library code used).

``naive_policy_loss(token_term)`` turns a per-token reference term into a full reference policy
loss: it applies weights, the train/inference correction and the aggregation with explicit loops
over sequences and tokens. ``token_term(b, t, log_probs, old_log_probs, advantages, mask, **kw)``
returns the loss of token (b, t) as a 0-d tensor (differentiable through ``log_probs``);
``old_log_probs`` and ``advantages`` arrive detached.
"""

from __future__ import annotations

import math

import torch


def masked_positions(mask, b):
    """Indices t of row b where the mask is on."""
    return [t for t in range(mask.shape[1]) if bool(mask[b, t])]


def naive_aggregate(per_token, mask, agg_mode, *, global_tokens=None, global_seqs=None, norm_len=None):
    """per_token: list of rows, each a list of 0-d tensors (None where masked out)."""
    B, T = mask.shape
    zero = torch.zeros((), dtype=torch.float64)
    if agg_mode == "token-mean":
        total, count = zero, 0
        for b in range(B):
            for t in masked_positions(mask, b):
                total = total + per_token[b][t]
                count += 1
        denom = count if global_tokens is None else float(global_tokens)
        return total / max(denom, 1)
    seq_values, nonempty = [], 0
    for b in range(B):
        ts = masked_positions(mask, b)
        if not ts:
            continue
        nonempty += 1
        s = zero
        for t in ts:
            s = s + per_token[b][t]
        if agg_mode == "seq-mean-token-mean":
            s = s / len(ts)
        elif agg_mode == "seq-mean-token-sum-norm":
            s = s / (T if norm_len is None else norm_len)
        elif agg_mode != "seq-mean-token-sum":
            raise AssertionError(agg_mode)
        seq_values.append(s)
    denom = nonempty if global_seqs is None else float(global_seqs)
    total = zero
    for s in seq_values:
        total = total + s
    return total / max(denom, 1)


def naive_correction_weight(b, t, old, rollout, mask, *, mode, level, cap, low, high):
    """Importance weight of token (b, t): a Python float."""
    if level == "token":
        log_rho = float(old[b, t]) - float(rollout[b, t])
    else:
        ts = masked_positions(mask, b)
        log_rho = sum(float(old[b, s]) - float(rollout[b, s]) for s in ts)
        if level == "geometric":
            log_rho /= len(ts)
    rho = math.exp(log_rho)
    if mode == "tis":
        return min(rho, cap)
    if mode == "mis":
        return rho if low <= rho <= high else 0.0
    raise AssertionError(mode)


def naive_policy_loss(token_term):
    def ref(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        *,
        weights=None,
        rollout_log_probs=None,
        correction=None,
        correction_level="token",
        correction_cap=2.0,
        correction_low=0.5,
        correction_high=2.0,
        agg_mode="token-mean",
        global_tokens=None,
        global_seqs=None,
        norm_len=None,
        **kwargs,
    ):
        mask = mask.bool()
        old = old_log_probs.detach()
        adv = advantages.detach()
        B, T = mask.shape
        per_token = [[None] * T for _ in range(B)]
        for b in range(B):
            for t in masked_positions(mask, b):
                value = token_term(b, t, log_probs, old, adv, mask, **kwargs)
                if weights is not None:
                    value = value * weights[b, t]
                if correction is not None:
                    value = value * naive_correction_weight(
                        b,
                        t,
                        old,
                        rollout_log_probs.detach(),
                        mask,
                        mode=correction,
                        level=correction_level,
                        cap=correction_cap,
                        low=correction_low,
                        high=correction_high,
                    )
                per_token[b][t] = value
        return naive_aggregate(
            per_token, mask, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len
        )

    return ref


def val(x) -> float:
    """Python float of a tensor or number, without touching autograd."""
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def clip_value(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x
