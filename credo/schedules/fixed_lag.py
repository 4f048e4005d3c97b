"""`stages.schedule: fixed_lag`: the batch of step k comes from the policy of version k-1-S exactly, in one process.

Settings (`stages.schedule_kwargs`): `max_staleness` (S >= 1). It wraps any rollout source whose batches can be held
in a checkpoint (capability `batch_state`: the default, multi-turn, complementary, one-sample and CE-RM sources; not
palette's, whose per-sample latents and prefixes the saved batch does not carry).

    step k:  generate the batch of step k+S with the current weights (version k-1)   -> pending
             train on the batch of step k, generated S steps earlier (version k-1-S)  <- pending

At the first step the batches of steps 1..1+S are generated from the initial weights (version 0), so steps
1..S+1 train on version 0 and every later step k on version k-1-S. The prompts and sampling seeds of a batch are
those of the step it trains (functions of (run seed, step), as in a synchronous run); only the weights lag. The
pending batches are part of the trainer state: a checkpoint holds them (written by `torch.save`, as they hold
tensors), so a resume, even after a SIGKILL, trains on exactly the batches the uninterrupted run would have, and a
rollback (MIPU) puts them back. This is the mode for algorithm research (the staleness-LR law) and exact tests;
`overlap` is the mode that runs generation beside training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.capabilities import BATCH_STATE
from credo.config.fields import ranged
from credo.schedules import Schedule
from credo.train.batch import Batch
from credo.train.staleness import staleness_metrics


class FixedLagSource:
    """Wraps a rollout source (any: single-turn prompts, multi-turn episodes) so that step k trains on the batch the
    wrapped source generated at step k-S. `last_step` (run.steps): no batch is generated for a step past it."""

    def __init__(self, inner, staleness: int, *, last_step: int):
        if staleness < 1:
            raise ValueError(f"staleness is {staleness}, expected >= 1 (0 is the synchronous source itself)")
        self.inner, self.staleness, self.last_step = inner, staleness, last_step
        self.pending: dict[int, Batch] = {}

    def rollout(self, step: int) -> Batch:
        # a resume or a rollback may leave batches of steps already trained: they are not trained again
        for old in [s for s in self.pending if s < step]:
            del self.pending[old]
        # normally only step + S is missing; at the first step (or after a change of S) every one up to it is
        for future in range(step, min(step + self.staleness, self.last_step) + 1):
            if future not in self.pending:
                self.pending[future] = self.inner.rollout(future)
        batch = self.pending.pop(step)
        batch.metrics.update(staleness_metrics(batch, self.staleness))
        batch.metrics.update({"async/queue_len": float(len(self.pending)), "async/dropped_stale": 0.0})
        return batch

    def generate(self, prompts, *, temperature: float, seeds):
        return self.inner.generate(prompts, temperature=temperature, seeds=seeds)

    def sync(self, model: torch.nn.Module, step: int) -> None:
        self.inner.sync(model, step)

    def state_dict(self) -> dict:
        """The pending batches (steps k+1..k+S after step k) and the wrapped source's own state."""
        return {"pending": {step: _batch_state(b) for step, b in self.pending.items()},
                "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.pending = {int(step): _batch_from_state(b) for step, b in state["pending"].items()}
        self.inner.load_state_dict(state["inner"])

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):
        # what a family reads off its own source (the multi-turn evaluator: run_episodes, evaluate) stays reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _batch_state(b: Batch) -> dict:
    """A generated, not yet trained batch: samples, problems, group ids and the rollout's metrics."""
    return {"samples": b.samples, "problems": b.problems, "group_ids": b.group_ids, "step": b.step,
            "metrics": dict(b.metrics)}


def _batch_from_state(s: dict) -> Batch:
    return Batch(samples=s["samples"], problems=s["problems"], group_ids=s["group_ids"], step=s["step"],
                 metrics=dict(s["metrics"]))


@dataclass
class FixedLagSettings:
    max_staleness: int = ranged(1, ge=1)
    """S: step k trains on the batch sampled by the policy of version k-1-S exactly."""


def wrap(source, ctx, s: FixedLagSettings) -> FixedLagSource:
    return FixedLagSource(source, s.max_staleness, last_step=ctx.recipe.run.steps)


SCHEDULE = Schedule(name="fixed_lag", doc="a fixed lag of S policy versions, in one process, deterministic "
                    "(docs/async.md; arXiv 2510.11345's staleness bound, exactly)", settings=FixedLagSettings,
                    wrap=wrap, source_needs=frozenset({BATCH_STATE}), staleness=lambda s: s.max_staleness)
