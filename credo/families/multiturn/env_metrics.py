"""The envs' own per-episode metrics, averaged over the held-out episodes of an evaluation.

An env may report what its return does not say: the shop (docs/shop.md) reports full success, attribute match,
its failure type and its call counts. The protocol, any env may follow it:

    env.episode_metrics() -> {name: float}     the episode's metrics so far (at any time: after an episode the
                                               source cut too)
    info["episode_metrics"]                    the same dict, in the info of the env step that ends the episode

The evaluator logs the mean of each name over the episodes that report it as `eval/<name>` (the shop's
`shop/success` becomes `eval/shop/success`), beside `eval/return`. Failed episodes (their env raised or overran)
are left out, as from `eval/return`. An env proxy without the method (a Ray env worker's) reports through the
info of its last step, so there episodes the source cut (env.max_total_tokens, env.max_turns before the env's
own budget) are left out. An env that reports nothing adds no key.
"""

from __future__ import annotations

import torch

from credo.distributed.engine import all_reduce_sum


def episode_metrics_of(e) -> dict[str, float] | None:
    """Episode `e`'s env metrics: the env's `episode_metrics()` if it has one, else the `episode_metrics` of its last
    step's info; None when it failed or its env reports none."""
    if e.end == "failed":
        return None
    method = getattr(e.env, "episode_metrics", None)
    got = method() if callable(method) else e.last_info_metrics
    return dict(got) if isinstance(got, dict) else None


def _all_names(names: list[str]) -> list[str]:
    """The sorted union of every rank's metric names (every rank must all-reduce the same layout)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return sorted(names)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, sorted(names))
    return sorted({n for p in parts for n in p})


def held_out_means(episodes) -> dict[str, float]:
    """`eval/<name>`: the mean of each env metric over the episodes (of every rank) that report it; {} when none do.
    Sums and counts are all-reduced in double precision, so the means do not depend on how ranks split them."""
    reported = [m for m in (episode_metrics_of(e) for e in episodes) if m is not None]
    names = _all_names(list({k for m in reported for k in m}))
    if not names:
        return {}
    sums = [sum(float(m[k]) for m in reported if k in m) for k in names]
    counts = [float(sum(k in m for m in reported)) for k in names]
    tot = all_reduce_sum(torch.tensor(sums + counts, dtype=torch.float64)).tolist()
    n = len(names)
    return {f"eval/{k}": tot[i] / tot[n + i] for i, k in enumerate(names) if tot[n + i]}
