"""Naive per-token references of the policy losses in credo.algos.policy_losses (loops, floats).

Each token term follows the paper's per-token equation directly; ``naive_policy_loss`` adds the
common parts (weights, corrections, aggregation) with loops.
"""

from __future__ import annotations

import math

import torch

from tests.algos.naive_common import clip_value, masked_positions, naive_policy_loss, val
from tests.reference_registry import reference


def _uniform(generator, lo, hi):
    return lo + (hi - lo) * float(torch.rand((), generator=generator))


def _coin(generator):
    return bool(torch.rand((), generator=generator) < 0.5)


def _ppo_kwargs(B, T, g):
    return {
        "clip_low": _uniform(g, 0.05, 0.3),
        "clip_high": _uniform(g, 0.05, 0.4),
        "dual_clip": 3.0 if _coin(g) else (1.2 if _coin(g) else None),
    }


@reference("policy_loss", "ppo", make_kwargs=_ppo_kwargs)
@naive_policy_loss
def ppo(b, t, lp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=None):
    ratio = torch.exp(lp[b, t] - old[b, t])
    a = float(adv[b, t])
    r = val(ratio)
    clipped = ratio if 1 - clip_low <= r <= 1 + clip_high else clip_value(r, 1 - clip_low, 1 + clip_high)
    objective = min(ratio * a, clipped * a, key=val)
    if dual_clip is not None and a < 0 and val(objective) < dual_clip * a:
        return torch.tensor(-dual_clip * a, dtype=torch.float64)
    return -objective


@reference("policy_loss", "reinforce")
@naive_policy_loss
def reinforce(b, t, lp, old, adv, mask):
    return -float(adv[b, t]) * lp[b, t]


def _gspo_kwargs(B, T, g):
    return {"clip_low": _uniform(g, 0.01, 0.2), "clip_high": _uniform(g, 0.01, 0.2)}


@reference("policy_loss", "gspo", make_kwargs=_gspo_kwargs)
@naive_policy_loss
def gspo(b, t, lp, old, adv, mask, clip_low=3e-4, clip_high=4e-4):
    ts = masked_positions(mask, b)
    seq_ratio = math.exp(sum(val(lp[b, s]) - float(old[b, s]) for s in ts) / len(ts))
    # value seq_ratio, gradient seq_ratio * grad log pi(a_t): GSPO-token, paper Sec. 4.3
    s = seq_ratio * torch.exp(lp[b, t] - val(lp[b, t]))
    a = float(adv[b, t])
    if 1 - clip_low <= seq_ratio <= 1 + clip_high:
        clipped = s
    else:
        clipped = clip_value(seq_ratio, 1 - clip_low, 1 + clip_high)
    return -min(s * a, clipped * a, key=val)


def _cispo_kwargs(B, T, g):
    return {"clip_low": _uniform(g, 0.05, 1.0), "clip_high": _uniform(g, 0.05, 0.5)}


@reference("policy_loss", "cispo", make_kwargs=_cispo_kwargs)
@naive_policy_loss
def cispo(b, t, lp, old, adv, mask, clip_low=1.0, clip_high=4.0):
    weight = clip_value(math.exp(val(lp[b, t]) - float(old[b, t])), 1 - clip_low, 1 + clip_high)
    return -weight * float(adv[b, t]) * lp[b, t]


def _topr_kwargs(B, T, g):
    kw = {
        "positive_weight": _uniform(g, 0.5, 1.5),
        "negative_weight": _uniform(g, 0.5, 1.5),
        "ratio_level": "sequence" if _coin(g) else "token",
    }
    if _coin(g):
        kw["scores"] = (torch.rand(B, generator=g) > 0.5).double()
    return kw


@reference("policy_loss", "topr", make_kwargs=_topr_kwargs)
@naive_policy_loss
def topr(b, t, lp, old, adv, mask, scores=None, positive_weight=1.0, negative_weight=1.0, ratio_level="token"):
    ts = masked_positions(mask, b)
    if scores is None:
        positive = sum(float(adv[b, s]) for s in ts) > 0
    else:
        positive = float(scores[b]) > 0
    a = float(adv[b, t])
    if positive:
        return -positive_weight * a * lp[b, t]
    if ratio_level == "token":
        ratio = math.exp(val(lp[b, t]) - float(old[b, t]))
    else:
        ratio = math.exp(sum(val(lp[b, s]) - float(old[b, s]) for s in ts))
    return -negative_weight * min(ratio, 1.0) * a * lp[b, t]


def _sapo_kwargs(B, T, g):
    return {"tau_pos": _uniform(g, 0.5, 3.0), "tau_neg": _uniform(g, 0.5, 3.0)}


@reference("policy_loss", "sapo", make_kwargs=_sapo_kwargs)
@naive_policy_loss
def sapo(b, t, lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    a = float(adv[b, t])
    tau = tau_pos if a > 0 else tau_neg
    ratio = torch.exp(lp[b, t] - old[b, t])
    gate = 1 / (1 + torch.exp(-tau * (ratio - 1)))
    return -(4 / tau) * gate * a


def _kimi_kwargs(B, T, g):
    return {"tau": _uniform(g, 0.01, 0.5)}


@reference("policy_loss", "kimi15", make_kwargs=_kimi_kwargs)
@naive_policy_loss
def kimi15(b, t, lp, old, adv, mask, tau=0.1):
    return -float(adv[b, t]) * lp[b, t] + tau / 2 * (lp[b, t] - float(old[b, t])) ** 2
