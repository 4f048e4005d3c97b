"""Advantage stages: a rewarded, packed batch in, `batch.advantages [B, T]` out.

    class AdvantageStage(Protocol):
        def __call__(self, batch: Batch) -> None      # sets batch.advantages [B, T], 0 outside loss_mask
        def state_dict(self) -> dict / load_state_dict  # critics carry engines and optimizers

`OutcomeAdvantage` runs an outcome estimator of `credo.algos` (grpo, rloo, reinforce_pp, ...) over the
batch gathered from every rank, on the real [B, T] response mask, and keeps this rank's rows. Critics
with GAE are stages with state of their own.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from credo.distributed.engine import all_gather_cat, all_reduce_max, rank_and_world
from credo.train.batch import Batch


class AdvantageStage(Protocol):
    def __call__(self, batch: Batch) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def gather_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T] -> [world * B, width]: right-pad each rank's rows to a common width, then gather."""
    return all_gather_cat(F.pad(x, (0, width - x.shape[1])))


class OutcomeAdvantage:
    """Outcome estimator `fn(rewards [N], group_ids [N], mask [N, T], **kwargs) -> [N, T]` over the global batch.

    The estimator sees the samples with a valid reward and their response masks (so token-weighted
    estimators, e.g. REINFORCE++ whitening, count each sample's real length); samples whose reward
    failed get advantage 0 and no say in the group or batch statistics. The result is multiplied by the
    loss mask, so overlong-filtered samples still count in their group's baseline but train on nothing.
    """

    def __init__(self, estimator: Callable, kwargs: dict):
        self.estimator, self.kwargs = estimator, dict(kwargs)

    def __call__(self, batch: Batch) -> None:
        rank, world = rank_and_world()
        B, T = batch.response_mask.shape
        width = int(all_reduce_max(torch.tensor(T, device="cpu")))
        mask = gather_rows(batch.response_mask, width)
        rewards, valid, group_ids = (all_gather_cat(t) for t in (batch.rewards, batch.valid, batch.group_ids))
        adv = torch.zeros(mask.shape, dtype=rewards.dtype, device=mask.device)
        if valid.any():
            adv[valid] = self.estimator(rewards[valid], group_ids[valid], mask[valid], **self.kwargs).to(adv.dtype)
        batch.advantages = adv[rank * B:(rank + 1) * B, :T] * batch.loss_mask

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
