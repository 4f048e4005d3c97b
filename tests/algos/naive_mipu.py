"""Naive reference of the MIPU Step-1 loss (credo.algos.mipu), written with loops and floats."""

from __future__ import annotations

import math

import torch

from tests.algos.naive_common import masked_positions, naive_policy_loss, val
from tests.reference_registry import reference


def _mipu_kwargs(B, T, g):
    u = torch.rand(5, generator=g).tolist()
    return {
        "w_max": 1.0 + 2.0 * u[0],
        "sequence_level": u[1] < 0.5,
        "clip_low": 0.05 + 0.25 * u[2],
        "clip_high": 0.05 + 0.35 * u[3],
        "dual_clip": 3.0 if u[4] < 0.5 else (1.2 if u[4] < 0.75 else None),
    }


def naive_mipu_weight(b, t, old, rollout, mask, w_max, sequence_level):
    """min(pi_old / mu, w_max) of token (b, t); sequence level: geometric mean over the row."""
    if rollout is None:
        return 1.0
    if sequence_level:
        ts = masked_positions(mask, b)
        log_w = sum(float(old[b, s]) - float(rollout[b, s]) for s in ts) / len(ts)
    else:
        log_w = float(old[b, t]) - float(rollout[b, t])
    return min(math.exp(max(min(log_w, 20.0), -20.0)), w_max)


def naive_dual_clip_term(ratio, a, clip_low, clip_high, dual_clip):
    """-(dual-clipped PPO objective) for one token; ratio is a differentiable 0-d tensor."""
    r = val(ratio)
    surrogates = [ratio * a, (min(max(r, 1 - clip_low), 1 + clip_high)) * a]
    if 1 - clip_low <= r <= 1 + clip_high:
        surrogates[1] = ratio * a  # inside the clip range the clipped branch keeps the gradient
    objective = surrogates[0] if val(surrogates[0]) <= val(surrogates[1]) else surrogates[1]
    if dual_clip is not None and a < 0 and val(objective) < dual_clip * a:
        return torch.tensor(-dual_clip * a, dtype=torch.float64)
    return -objective


@reference("policy_loss", "mipu", make_kwargs=_mipu_kwargs)
def mipu(
    log_probs,
    old_log_probs,
    advantages,
    mask,
    *,
    rollout_log_probs=None,
    w_max=2.0,
    sequence_level=False,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=3.0,
    **common,
):
    rollout = None if rollout_log_probs is None else rollout_log_probs.detach()

    def term(b, t, lp, old, adv, mask):
        ratio = torch.exp(lp[b, t] - old[b, t])
        w = naive_mipu_weight(b, t, old, rollout, mask, w_max, sequence_level)
        return w * naive_dual_clip_term(ratio, float(adv[b, t]), clip_low, clip_high, dual_clip)

    return naive_policy_loss(term)(log_probs, old_log_probs, advantages, mask, rollout_log_probs=rollout, **common)
