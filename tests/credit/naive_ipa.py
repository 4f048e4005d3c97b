"""Naive reference of the IPA chunk-level policy loss (arXiv 2512.24873), with explicit loops.

Chunks are found by walking each row (no library code); the common parts (correction weight,
aggregation) use the loop helpers of tests/algos/naive_common.py.
"""

from __future__ import annotations

import math

import torch

from tests.algos.naive_common import naive_aggregate, naive_correction_weight
from tests.reference_registry import reference


def naive_chunks(mask, b, chunk_ids=None):
    """Chunks of row b as lists of token indices, in order of first token.

    Without chunk_ids: maximal runs of masked-in tokens. With chunk_ids: masked-in tokens grouped
    by their id.
    """
    T = mask.shape[1]
    if chunk_ids is None:
        chunks, current = [], []
        for t in range(T):
            if bool(mask[b, t]):
                current.append(t)
            elif current:
                chunks.append(current)
                current = []
        if current:
            chunks.append(current)
        return chunks
    groups = {}
    for t in range(T):
        if bool(mask[b, t]):
            groups.setdefault(int(chunk_ids[b, t]), []).append(t)
    return list(groups.values())


def _ipa_kwargs(B, T, g):
    def uniform(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=g))

    kwargs = {
        "ratio_low": uniform(0.7, 0.95),
        "ratio_high": uniform(1.05, 1.4),
        "positive_weight": uniform(0.5, 1.5),
        "negative_weight": uniform(0.5, 1.5),
    }
    if float(torch.rand((), generator=g)) < 0.5:
        # Random contiguous segments covering every position: valid for any mask.
        starts = torch.rand(T, generator=g) < 0.3
        starts[0] = True
        kwargs["chunk_ids"] = (starts.long().cumsum(0) - 1).expand(B, T).clone()
    if float(torch.rand((), generator=g)) < 0.5:
        kwargs["diff_low"], kwargs["diff_high"] = uniform(-0.2, -0.02), uniform(0.02, 0.2)
    return kwargs


@reference("policy_loss", "ipa", make_kwargs=_ipa_kwargs)
def ipa(
    log_probs,
    old_log_probs,
    advantages,
    mask,
    *,
    chunk_ids=None,
    rollout_log_probs=None,
    ratio_low=0.8,
    ratio_high=1.2,
    diff_low=None,
    diff_high=None,
    positive_weight=1.0,
    negative_weight=1.0,
    max_log_ratio=20.0,
    weights=None,
    correction=None,
    correction_level="token",
    correction_cap=2.0,
    correction_low=0.5,
    correction_high=2.0,
    agg_mode="token-mean",
    global_tokens=None,
    global_seqs=None,
    norm_len=None,
):
    mask = mask.bool()
    B, T = mask.shape
    old = old_log_probs.detach()
    current = log_probs.detach()
    rollout = None if rollout_log_probs is None else rollout_log_probs.detach()
    per_token = [[None] * T for _ in range(B)]
    for b in range(B):
        for chunk in naive_chunks(mask, b, chunk_ids):
            # rho_c = (prod_t pi / pi_old)^(1/|c|), through a clamped mean log-ratio
            mean_log_ratio = sum(float(current[b, t]) - float(old[b, t]) for t in chunk) / len(chunk)
            rho = math.exp(min(max(mean_log_ratio, -max_log_ratio), max_log_ratio))
            kept = True
            if rollout is not None:
                geo = math.exp(sum(float(old[b, t]) - float(rollout[b, t]) for t in chunk) / len(chunk))
                kept = (ratio_low is None or geo >= ratio_low) and (ratio_high is None or geo <= ratio_high)
                diff = sum(math.exp(float(old[b, t])) - math.exp(float(rollout[b, t])) for t in chunk)
                diff /= len(chunk)
                kept = kept and (diff_low is None or diff >= diff_low)
                kept = kept and (diff_high is None or diff <= diff_high)
            for t in chunk:
                a = float(advantages[b, t])
                if a > 0:
                    coef = positive_weight
                else:
                    coef = negative_weight * min(max(rho, 0.0), 1.0)
                value = -coef * a * log_probs[b, t]
                if weights is not None:
                    value = value * float(weights[b, t])
                if correction is not None:
                    value = value * naive_correction_weight(
                        b,
                        t,
                        old,
                        rollout,
                        mask,
                        mode=correction,
                        level=correction_level,
                        cap=correction_cap,
                        low=correction_low,
                        high=correction_high,
                    )
                per_token[b][t] = value if kept else 0.0 * log_probs[b, t]
    return naive_aggregate(
        per_token, mask, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len
    )
