"""The train/inference mismatch metrics every step logs (`mismatch/*`): the sampler's log-probs mu against the
trainer's pi_old on the rollout tokens, over all ranks (`credo.algos.mismatch_metrics`, arXiv 2606.29526)."""

from __future__ import annotations

import math

import torch

from credo.algos.mismatch import MISMATCH_METRICS, mismatch_metrics
from credo.train.batch import Batch


def gather_ragged(x: torch.Tensor) -> torch.Tensor:
    """Concatenate 1-D tensors of different lengths from all ranks (rank order); `x` itself in a world of one."""
    import torch.distributed as dist

    from credo.distributed.engine import device

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return x
    n = torch.tensor([x.numel()], device=device())
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    width = int(max(int(s) for s in sizes))
    y = torch.zeros(width, dtype=x.dtype, device=device())
    y[: x.numel()] = x.to(device())
    parts = [torch.empty_like(y) for _ in sizes]
    dist.all_gather(parts, y)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes)]).to(x.device)


def step_mismatch_metrics(batch: Batch, pi_old: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """`credo.algos.mismatch_metrics` of the step over all ranks: the sampler's log-probs against `pi_old`.

    Args:
        batch: the step's packed batch (`rollout_log_probs`, `loss_mask` [B, T]).
        pi_old: [B, T] the trainer's log-probs of the same tokens before the update (the recompute's, or the
            first on-policy pass's).
        mask: [B, T] bool, the tokens compared (default `batch.loss_mask`); under `algo.old_log_probs: rollout` the
            first mini-batch's loss tokens, the only ones the trainer scored with the weights before the update.

    Returns:
        The `mismatch/*` metrics; {} when the sampler gave no log-probs, NaN for each when a value is not
        finite (a step with a non-finite loss) or no rank has a loss token. A truncating sampler's batch
        (`batch.kept_rule` set: top-k, top-p < 1 or min-p) adds `mismatch/ratio_mean`, the token mean of
        pi_old / mu: the mean kept mass S without kept-set replay, 1 with it (docs/truncated_sampling.md).
    """
    if not any(s.rollout_log_probs for s in batch.samples):
        return {}
    m = batch.loss_mask if mask is None else mask
    trainer = gather_ragged(pi_old[m].detach().double())
    sampler = gather_ragged(batch.rollout_log_probs[m].detach().double())
    if not (torch.isfinite(trainer).all() and torch.isfinite(sampler).all()):
        return {k: math.nan for k in MISMATCH_METRICS}
    out = mismatch_metrics(trainer[None], sampler[None], torch.ones(1, trainer.numel(), dtype=torch.bool,
                                                                    device=trainer.device))
    if getattr(batch, "kept_rule", None) is not None:
        out["mismatch/ratio_mean"] = float((trainer - sampler).exp().mean()) if trainer.numel() else math.nan
    return out


def routing_metrics(batch: Batch) -> dict[str, float]:
    """The MoE routing metrics of the step's pi_old forward over all ranks, against the routing the sampler recorded
    (`batch.routing_counts`, `credo.moe`), as shares of recorded (token, layer) slots:

        moe/routing_disagreement   the experts the trainer ran differ from the sampler's (0 under algo.router_replay)
        moe/router_disagreement    the trainer router's own top-k differs from the sampler's (what replay overrides;
                                   equal to the first without replay)

    {} when the batch recorded no routing or no pi_old forward ran."""
    counts = getattr(batch, "routing_counts", None)
    if counts is None:
        return {}
    from credo.distributed.engine import all_reduce_sum

    used, own, slots = all_reduce_sum(torch.tensor([counts.used, counts.own, counts.slots], dtype=torch.float64,
                                                   device="cpu")).tolist()
    if not slots:
        return {"moe/routing_disagreement": math.nan, "moe/router_disagreement": math.nan}
    return {"moe/routing_disagreement": used / slots, "moe/router_disagreement": own / slots}
