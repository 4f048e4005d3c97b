"""The updater: the epoch / mini-batch / micro-batch loop, and the non-finite skip.

For each of `ppo_epochs` passes, the batch is split into `mini_batches` optimizer steps, each
accumulated over micro-batches of at most `micro_batch_size` sequences, or (`micro_batch_tokens` > 0) of at
most that many tokens (`credo.train.packing.token_micro_batches`; every rank runs as many as the rank that needs
the most, and DeepSpeed is told which micro-batch ends the mini-batch). A mini-batch whose loss or
gradient is non-finite is skipped as a whole (no weight, moment or LR moves). The engine is a
`credo.distributed.engines.TrainEngine` (DeepSpeed or FSDP2): the loop calls only its interface.
"""

from __future__ import annotations

import logging
import math

import torch

from credo.distributed.engine import all_reduce_max, all_reduce_sum
from credo.train.batch import Batch
from credo.train.mismatch import routing_metrics, step_mismatch_metrics
from credo.train.objective import Objective
from credo.train.packing import row_lengths, split_to, token_micro_batches
from credo.train.scoring import PolicyScorer

log = logging.getLogger("credo")


def grad_accum_steps(local_samples: int, mini_batches: int, micro_batch_size: int) -> int:
    """Micro-batches per optimizer step for one rank's `local_samples` split into `mini_batches`."""
    mini = math.ceil(local_samples / mini_batches)
    return min(math.ceil(mini / micro_batch_size), mini)


class Updater:
    """Runs the policy update of one batch on a training engine; returns its metrics and skip count."""

    def __init__(self, engine, scorer: PolicyScorer, objective: Objective, *, ppo_epochs: int, mini_batches: int,
                 grad_accum: int, zero_stage: int, world: int, fault_nan_steps: frozenset[int] = frozenset(),
                 train_mode: bool = False, micro_batch_tokens: int = 0, packed: bool = False,
                 old_log_probs: str = "recompute"):
        self.engine, self.scorer, self.objective = engine, scorer, objective
        # algo.old_log_probs: rollout: pi_old is the sampler's; the mismatch metrics then read the first mini-batch's
        # own forward, the one pass that runs the weights before the update
        self.old_from_rollout = old_log_probs == "rollout"
        self.ppo_epochs, self.mini_batches, self.grad_accum = ppo_epochs, mini_batches, grad_accum
        self.micro_batch_tokens, self.packed = micro_batch_tokens, packed
        self.zero_stage, self.world = zero_stage, world
        self.fault_nan_steps = fault_nan_steps  # test hook: the loss of these steps is forced to NaN
        # the update's forwards in training mode: gradient checkpointing and LoRA dropout act only there (the
        # module is otherwise left in eval mode, as from_pretrained returns it)
        self.train_mode = train_mode

    def update(self, batch: Batch) -> tuple[dict[str, float], int]:
        if not self.train_mode:
            return self._update(batch)
        module = self.engine.module
        was_training = module.training
        module.train()
        try:
            return self._update(batch)
        finally:
            module.train(was_training)

    def _update(self, batch: Batch) -> tuple[dict[str, float], int]:
        engine, B = self.engine, len(batch)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        skipped = 0
        checked_norm = float("nan")  # the norm checked on ZeRO-0, where DeepSpeed reports none
        n_micro = 0
        # pi_old for the mismatch metrics: the recompute's, or (one on-policy pass) the first pass's own log-probs
        pi_old = batch.old_log_probs if batch.old_log_probs is not None else torch.zeros_like(batch.rollout_log_probs)
        seen = None  # old_log_probs: rollout: [B] bool, the rows whose pi_old the first mini-batch's forward gave
        if self.old_from_rollout:
            pi_old = torch.zeros_like(batch.rollout_log_probs)
            seen = torch.zeros(B, dtype=torch.bool, device=batch.loss_mask.device)
        for epoch in range(self.ppo_epochs):
            for j, mb in enumerate(torch.arange(B, device="cpu").tensor_split(self.mini_batches)):
                mb_mask = batch.loss_mask[mb]
                gt, gs = all_reduce_sum(torch.stack([mb_mask.sum(), (mb_mask.sum(-1) > 0).sum()])).clamp_min(1)
                bad = None
                micros = self.micro_batches(batch, mb)
                n_micro += len(micros)
                for k, micro in enumerate(micros):
                    if self.micro_batch_tokens:  # their number varies: the engine cannot count to the boundary
                        engine.set_accumulation_boundary(k == len(micros) - 1)
                    m = batch.loss_mask[micro]
                    # Probes without a recompute to ride take this forward (weights set before the loss).
                    lp, ent = self.scorer.update_forward(engine.module, batch, micro)
                    loss, terms, metrics = self.objective(
                        lp, ent, old_log_probs=lp.detach() if batch.old_log_probs is None else batch.old_log_probs[micro],
                        advantages=batch.advantages[micro], mask=m, rollout_log_probs=batch.rollout_log_probs[micro],
                        ref_log_probs=None if batch.ref_log_probs is None else batch.ref_log_probs[micro],
                        weights=None if batch.weights is None else batch.weights[micro], global_tokens=gt, global_seqs=gs,
                        entropy_mask=None if batch.entropy_mask is None else batch.entropy_mask[micro],
                        target_terms={k: (c, t[micro]) for k, (c, t) in batch.target_terms.items()})
                    if batch.old_log_probs is None and epoch == 0:
                        pi_old[micro] = lp.detach().to(pi_old.dtype)
                    elif seen is not None and epoch == 0 and j == 0:
                        pi_old[micro] = lp.detach().to(pi_old.dtype)
                        seen[micro] = True
                    if batch.step in self.fault_nan_steps:
                        loss = loss * float("nan")
                    if not torch.isfinite(loss):
                        bad = bad or "loss"
                        loss = engine.nan_loss(loss)
                    engine.backward(loss, self.world)
                    finite, norm = engine.step()
                    if norm is not None:
                        checked_norm = norm
                    if not finite:
                        bad = bad or "grad_norm"
                    for k, v in terms.items():
                        if v is not None:
                            sums[k] = sums.get(k, 0.0) + float(v.detach())
                            counts[k] = 1
                    for k, v in metrics.items():
                        sums[f"loss/{k}"] = sums.get(f"loss/{k}", 0.0) + float(v)
                        counts[f"loss/{k}"] = counts.get(f"loss/{k}", 0) + 1
                if not (engine.step_applied() and bad is None):
                    skipped += 1
                    log.error("step %d: optimizer step skipped, non-finite %s", batch.step, bad or "grad_norm")
        out = self._metrics(sums, counts)
        out["train/grad_norm"] = engine.grad_norm(checked_norm)
        out["train/skipped_steps"] = skipped
        out.update(step_mismatch_metrics(batch, pi_old, mask=None if seen is None else batch.loss_mask & seen[:, None]))
        out.update(routing_metrics(batch))
        if self.micro_batch_tokens:
            out["perf/micro_batches"] = n_micro
        return out, skipped

    def _metrics(self, sums: dict, counts: dict) -> dict[str, float]:
        """The step's loss terms and loss metrics from their per-micro-batch sums, over all ranks; and train/loss."""
        out = {}
        totals = all_reduce_sum(torch.tensor(list(sums.values()), dtype=torch.float64, device="cpu")).tolist()
        passes = self.ppo_epochs * self.mini_batches
        for k, total in zip(sums, totals):
            # loss pieces are sums of globally normalised parts (divide by passes); loss metrics are means
            out[k] = total / passes if counts[k] == 1 else total / (counts[k] * self.world)
        out["train/loss"] = self.objective.total(out)
        return out

    def micro_batches(self, batch: Batch, mb: torch.Tensor) -> list[torch.Tensor]:
        """The micro-batches (row indices) of mini-batch `mb`: `grad_accum` equal splits, or token-budget groups."""
        if not self.micro_batch_tokens:
            return list(mb.tensor_split(self.grad_accum))
        lengths = row_lengths(batch.attention_mask[mb]).tolist()
        groups = token_micro_batches(lengths, self.micro_batch_tokens, packed=self.packed)
        count = int(all_reduce_max(torch.tensor(len(groups), device="cpu")))
        return [mb[torch.tensor(g, dtype=torch.long, device=mb.device)] for g in split_to(groups, count)]
