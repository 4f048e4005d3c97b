"""Reward models: a scored batch in, rewards [B] and a validity mask [B] out.

    class RewardModel(Protocol):
        def __call__(self, batch: Batch) -> None    # sets batch.rewards, batch.valid, adds metrics
        def close(self) -> None

`FunctionReward` runs a group reward function (the task's verifier by default) on the round-1
`RewardWorker`: per-call timeout, failures masked and counted. With `reward.functions` (a
`WeightedRewards`) it also passes the response ids and logs each function's mean over the step's
valid samples as `train/rewards/<name>`; a part whose name holds a '/' (`reward/sandbox_timeout`, a weight-0
part of `credo.tasks.code:sandbox_reward`) is logged under its own name. A batched LLM judge is another
`RewardModel` with the same two methods.
"""

from __future__ import annotations

from typing import Protocol

import torch

from credo.distributed.engine import all_reduce_sum
from credo.rewards.worker import RewardWorker
from credo.train.batch import Batch


class RewardModel(Protocol):
    def __call__(self, batch: Batch) -> None: ...

    def close(self) -> None: ...


class FunctionReward:
    """Score each group (a prompt's G responses) with `worker`'s function on the decoded responses."""

    def __init__(self, worker: RewardWorker, tokenizer, group_size: int):
        self.worker, self.tokenizer, self.G = worker, tokenizer, group_size

    def __call__(self, batch: Batch) -> None:
        G = self.G
        texts = self.tokenizer.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=True)
        if getattr(self.worker.fn, "takes_completion_ids", False):
            ids = [list(s.response_ids) for s in batch.samples]
            groups = [(texts[i:i + G], batch.problems[i:i + G], ids[i:i + G]) for i in range(0, len(texts), G)]
        else:
            groups = [(texts[i:i + G], batch.problems[i:i + G]) for i in range(0, len(texts), G)]
        res = self.worker(groups, step=batch.step)
        batch.rewards, batch.valid = torch.tensor(res.rewards, device="cpu"), torch.tensor(res.valid, device="cpu")
        batch.metrics["reward/failures"] = res.failures + res.timeouts
        batch.metrics["reward/timeouts"] = res.timeouts
        if res.parts:  # every rank holds the same functions, so the all-reduce lines up
            vals = torch.tensor(list(res.parts.values()), dtype=torch.float64, device="cpu")  # [F, B], NaN: skipped or failed
            seen = ~torch.isnan(vals)
            tot = all_reduce_sum(torch.stack([torch.where(seen, vals, 0.0).sum(1), seen.sum(1).double()]))
            for j, name in enumerate(res.parts):  # a part named 'group/metric' is a metric of its own name
                key = name if "/" in name else f"train/rewards/{name}"
                batch.metrics[key] = float(tot[0, j] / tot[1, j]) if tot[1, j] else float("nan")

    def close(self) -> None:
        self.worker.close()
