"""Staleness of asynchronous training (docs/async.md): how many policy versions a trained sample lags, its metrics,
and the learning rate scaled with the bound.

A sample trained at step k that the weights after step v sampled (`Sample.policy_version` = v) has staleness
k - 1 - v: 0 in a synchronous run, S for every sample of a `fixed_lag` run past its first S + 1 steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from credo.train.batch import Batch


def sample_staleness(batch: Batch) -> list[int]:
    """Each sample's staleness at the step that trains it: batch.step - 1 - policy_version."""
    return [batch.step - 1 - s.policy_version for s in batch.samples]


def staleness_metrics(batch: Batch, bound: int) -> dict[str, float]:
    """The step's staleness over all ranks' samples.

    Returns:
        async/staleness_mean, async/staleness_max, async/staleness_frac_<s> for s = 0..bound (the histogram) and
        async/stale_frac (the fraction staler than `bound`: samples a `stale_policy: keep` run trains on).
    """
    ages = torch.tensor(sample_staleness(batch), dtype=torch.float64)
    counts = torch.stack([(ages == s).sum() for s in range(bound + 1)] + [(ages > bound).sum()]).double()
    totals = torch.cat([counts, ages.sum()[None], torch.tensor([float(len(ages))], dtype=torch.float64)])
    top = ages.max() if len(ages) else torch.tensor(0.0, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        from credo.distributed.engine import device

        totals, top = totals.to(device()), top.to(device())
        dist.all_reduce(totals)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        totals, top = totals.cpu(), top.cpu()
    n = max(float(totals[-1]), 1.0)
    out = {"async/staleness_mean": float(totals[-2]) / n, "async/staleness_max": float(top)}
    out.update({f"async/staleness_frac_{s}": float(totals[s]) / n for s in range(bound + 1)})
    out["async/stale_frac"] = float(totals[bound + 1]) / n
    return out


def staleness_lr_factor(staleness: int, reference: int) -> float:
    """optim.staleness_lr_scaling's factor S_ref / max(S, S_ref): the learning rate falls as 1 / S past S_ref.

    An inference from the staleness-LR law eta_max ~ 1 / S (arXiv 2607.01083, which states the law, not this rule;
    docs/async.md measures its effect)."""
    return reference / max(staleness, reference)
