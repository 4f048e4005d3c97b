"""Naive references of the advantage estimators: Python lists, dicts and loops."""

from __future__ import annotations

import math

import torch

from tests.reference_registry import reference


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs, unbiased):
    m = _mean(xs)
    dof = len(xs) - 1 if unbiased else len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / dof) if dof > 0 else 0.0


def _groups(group_ids):
    groups = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    return groups


def _all_equal(xs):
    return len(set(xs)) <= 1


def _broadcast(seq_adv, mask):
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if bool(mask[b, t]):
                out[b, t] = seq_adv[b]
    return out


def _scale(x, members, unbiased, eps):
    """Divide by std + eps unless the members are all equal (or too few), then by 1."""
    if _all_equal(members) or len(members) < (2 if unbiased else 1):
        return x
    return x / (_std(members, unbiased) + eps)


@reference("advantage", "grpo")
def grpo(rewards, group_ids, mask, norm_std=True, eps=1e-6):
    r = rewards.tolist()
    adv = [0.0] * len(r)
    for members in _groups(group_ids).values():
        vals = [r[i] for i in members]
        for i in members:
            centered = 0.0 if _all_equal(vals) else r[i] - _mean(vals)
            adv[i] = _scale(centered, vals, True, eps) if norm_std else centered
    return _broadcast(adv, mask)


@reference("advantage", "reinforce")
def reinforce(rewards, group_ids, mask):
    return _broadcast(rewards.tolist(), mask)  # no baseline: every token carries its sequence's raw reward


@reference("advantage", "dr_grpo")
def dr_grpo(rewards, group_ids, mask):
    return grpo(rewards, group_ids, mask, norm_std=False)


@reference("advantage", "rloo")
def rloo(rewards, group_ids, mask):
    r = rewards.tolist()
    adv = [0.0] * len(r)
    for members in _groups(group_ids).values():
        if len(members) < 2 or _all_equal([r[i] for i in members]):
            continue
        for i in members:
            others = [r[j] for j in members if j != i]
            adv[i] = r[i] - _mean(others)
    return _broadcast(adv, mask)


def _whiten(values, counts, unbiased, eps):
    """Batch whitening with each value repeated counts[i] times (token weighting by repetition)."""
    pool = [v for v, c in zip(values, counts) for _ in range(c)]
    if not pool or _all_equal(pool):
        return [0.0] * len(values)
    m = _mean(pool)
    return [_scale(v - m, pool, unbiased, eps) for v in values]


def _lengths(mask, token_weighted):
    return [int(mask[b].sum()) if token_weighted else 1 for b in range(mask.shape[0])]


@reference("advantage", "reinforce_pp")
def reinforce_pp(rewards, group_ids, mask, eps=1e-8, token_weighted=True):
    return _broadcast(_whiten(rewards.tolist(), _lengths(mask, token_weighted), True, eps), mask)


@reference("advantage", "reinforce_pp_baseline")
def reinforce_pp_baseline(rewards, group_ids, mask, eps=1e-8, token_weighted=True):
    r = rewards.tolist()
    centered = [0.0] * len(r)
    for members in _groups(group_ids).values():
        vals = [r[i] for i in members]
        for i in members:
            centered[i] = 0.0 if _all_equal(vals) else r[i] - _mean(vals)
    return _broadcast(_whiten(centered, _lengths(mask, token_weighted), True, eps), mask)


@reference("advantage", "lite_ppo")
def lite_ppo(rewards, group_ids, mask, eps=1e-6):
    r = rewards.tolist()
    adv = [0.0] * len(r)
    for members in _groups(group_ids).values():
        vals = [r[i] for i in members]
        for i in members:
            centered = 0.0 if _all_equal(vals) else r[i] - _mean(vals)
            adv[i] = _scale(centered, r, True, eps)
    return _broadcast(adv, mask)


@reference("advantage", "gae")
def gae(token_rewards, values, mask, gamma=1.0, lam=1.0):
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    ret = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        ts = [t for t in range(T) if bool(mask[b, t])]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(ts):
            delta = float(token_rewards[b, t]) + gamma * next_value - float(values[b, t])
            a = delta + gamma * lam * next_adv
            adv[b, t] = a
            ret[b, t] = a + float(values[b, t])
            next_value, next_adv = float(values[b, t]), a
    return adv, ret


@reference("advantage", "rebn")
def rebn(turn_rewards, turn_mask, token_turn_ids, gamma=1.0, normalize=True, eps=1e-9, unbiased=False):
    B, K = turn_rewards.shape
    returns = {}
    for b in range(B):
        g = 0.0
        for k in reversed(range(K)):
            if bool(turn_mask[b, k]):
                g = float(turn_rewards[b, k]) + gamma * g
                returns[(b, k)] = g
    if normalize:
        pool = list(returns.values())
        if pool and not _all_equal(pool):
            m = _mean(pool)
            returns = {key: _scale(v - m, pool, unbiased, eps) for key, v in returns.items()}
        else:
            returns = {key: 0.0 for key in returns}
    out = torch.zeros(token_turn_ids.shape, dtype=torch.float64)
    for b in range(token_turn_ids.shape[0]):
        for t in range(token_turn_ids.shape[1]):
            k = int(token_turn_ids[b, t])
            if k >= 0:
                out[b, t] = returns[(b, k)]
    return out
