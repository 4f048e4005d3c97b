"""The RL trainer: `fit` is the loop, `train_step` a page of plain calls over one `Batch`.

    [hooks before the step] -> rollout -> reward -> pack -> advantage -> recompute (old/ref log-probs, probes)
    -> update -> sync -> [hooks after the sync]

A family's step hooks (`credo.train.hooks`) run around the step: MIPU snapshots the state before it and, after
the sync, accepts the update or rolls back.

Each call is a stage built once from the recipe by `credo.train.build`; the trainer reads no recipe
key. The same code runs as one process or data-parallel under `torchrun` / the `deepspeed` launcher:
each rank rolls out its shard of the step's prompts (all G responses of a prompt stay on one rank),
advantages are computed on the gathered batch, and losses are normalised by global token/sequence
counts so the update does not depend on the micro-batch or rank split.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch
import torch.distributed as dist

from credo.config import Recipe
from credo.errors import ConfigError, TrainingError
from credo.distributed.engine import all_gather_cat, all_reduce_sum, barrier, device
from credo.tracking import Tracker
from credo.train.batch import pack_batch
from credo.train.build import build
from credo.train.dump import dump_rollouts
from credo.train import hooks as step_hooks
from credo.train.interrupt import DeferredInterrupt, RunInterrupted


class Trainer:
    def __init__(self, r: Recipe):
        c = self.c = build(r)
        self.engine, self.source, self.reward, self.advantage = c.engine, c.source, c.reward, c.advantage
        self.scorer, self.updater, self.state, self.run_dir = c.scorer, c.updater, c.state, c.run_dir
        self.start_step = c.state.resume(c.resume, c.run_dir, rank=c.rank, world=c.world,
                                         allow_config_change=c.allow_config_change)
        if self.start_step:
            self.source.sync(self.engine.module, self.start_step)
        if c.rank == 0:
            name = f"config.resume-{self.start_step}.yaml" if c.state.config_changed else "config.yaml"
            (c.run_dir / name).write_text(c.config_yaml)
        self.tracker = Tracker(c.run_dir, start_step=self.start_step, enabled=c.rank == 0, config=c.config,
                               **c.tracker_args)
        # Everything built so far (models, engines, the modules of torch, transformers and DeepSpeed) lives for
        # the whole run: move it out of the collector's reach, as vLLM does after start-up. Otherwise each
        # full collection walks it again; one took 0.27 s, longer than a quickstart step.
        gc.collect()
        gc.freeze()

    def train_step(self, step: int) -> dict:
        c = self.c
        hook_s: dict[str, float] = {}
        step_hooks.before_step(c.hooks, step, hook_s)  # MIPU: the state to return to
        t0 = time.perf_counter()
        batch = self.source.rollout(step)
        t_roll = time.perf_counter()
        self.reward(batch)
        t_rew = time.perf_counter()
        pack_batch(batch, c.tokenizer.pad_token_id, overlong_filter=c.overlong_filter)
        empty = nothing_to_train(batch)  # None, or why no sample of any rank has a loss token
        if empty is None:
            self.advantage(batch)
            batch.to(device())
            self.scorer.recompute(self.engine.module, batch)
        t_lp = time.perf_counter()
        metrics, skipped = self.updater.update(batch) if batch.train_policy and empty is None else ({}, 0)
        t_upd = time.perf_counter()
        self.source.sync(self.engine.module, step)
        t_sync = time.perf_counter()
        metrics.update(step_hooks.after_sync(c.hooks, step, batch, hook_s))  # MIPU: accept, or roll back + re-sync
        metrics.update({f"perf/{name}_s": s for name, s in hook_s.items()})
        if c.dump_every and step % c.dump_every == 0:
            dump_rollouts(batch, c.tokenizer, c.run_dir / "rollouts", rank=c.rank)
        row = self.step_metrics(batch, metrics, times=(t0, t_roll, t_rew, t_lp, t_upd, t_sync))
        self.state.record_step(skipped, row["train/reward_failures"], step, empty=empty)
        row["train/skipped_total"] = self.state.counters.skipped_total
        return row

    def step_metrics(self, batch, metrics: dict, *, times: tuple) -> dict:
        """The step's logged row: rewards and lengths over all ranks, the update's metrics, stage timings."""
        t0, t_roll, t_rew, t_lp, t_upd, t_sync = times
        rew_all, val_all = all_gather_cat(batch.rewards), all_gather_cat(batch.valid)
        fails, timeouts = (int(v) for v in all_reduce_sum(torch.tensor(
            [batch.metrics.get("reward/failures", 0), batch.metrics.get("reward/timeouts", 0)], device="cpu")))
        lengths = all_gather_cat(torch.tensor([float(len(s.response_ids)) for s in batch.samples], device="cpu"))
        n_tok = all_reduce_sum(batch.attention_mask.sum().cpu()).item()
        elapsed = t_sync - t0
        # reward/failures and reward/timeouts are summed over ranks above; a reward model's own metrics
        # (e.g. a judge's reward/unparseable_frac) are logged as this rank reports them
        extra = {k: v for k, v in batch.metrics.items() if k not in ("reward/failures", "reward/timeouts")}
        return {
            "step": batch.step,
            "train/reward_mean": float(rew_all[val_all].mean()) if val_all.any() else float("nan"),
            "train/reward_std": float(rew_all[val_all].std()) if val_all.sum() > 1 else 0.0,
            **metrics,
            "train/response_len": float(lengths.mean()),
            "train/truncated_frac": float(1 - all_gather_cat(batch.finished.float().cpu()).mean()),
            "train/reward_failures": fails,
            "train/reward_timeouts": timeouts,
            "train/skipped_total": self.state.counters.skipped_total,
            "train/lr": self.engine.lr(),
            **extra,
            "perf/rollout_s": t_roll - t0,
            "perf/reward_s": t_rew - t_roll,
            "perf/logprob_s": t_lp - t_rew,
            "perf/update_s": t_upd - t_lp,
            "perf/sync_s": t_sync - t_upd,
            "perf/train_s": t_upd - t_rew,
            "perf/step_time_s": elapsed,
            "perf/tokens_per_s": n_tok / elapsed / self.c.world,
            "perf/peak_rss_gb": _peak_rss_gb(),
        }

    def evaluate(self) -> float:
        return self.c.evaluate()

    def eval_metrics(self) -> dict:
        """The evaluation's score under its metric, and the further metrics an evaluator reports in its
        `extra_metrics` (a multi-domain evaluator's per-discipline scores)."""
        score = self.evaluate()
        return {self.c.evaluate.metric: score, **getattr(self.c.evaluate, "extra_metrics", {})}

    def log_samples(self, step: int) -> None:
        """The evaluation's sample completions (samples/step_<step>.jsonl, the log), when the evaluator keeps them."""
        samples = getattr(self.c.evaluate, "last_samples", None)
        if samples and samples[0]:
            self.tracker.log_samples(step, *samples)

    def checkpoint(self, step: int) -> None:
        self.state.save(self.run_dir / "checkpoints", step, keep_last=self.c.keep_last,
                        param_digests=self.engine.param_digests())

    def fit(self) -> Path:
        """Train from `start_step` to the last step. Ctrl-C finishes the step in progress, checkpoints it and
        raises `RunInterrupted` (see `credo.train.interrupt`); a second Ctrl-C stops at once."""
        c = self.c
        done = saved = self.start_step  # the last finished step, and the newest checkpoint (a resume's own)
        with DeferredInterrupt(announce=c.rank == 0) as stop:
            try:
                if self.start_step == 0 and c.eval_every:
                    self.tracker.log({"step": 0, **self.eval_metrics()})
                    self.log_samples(0)
                for step in range(self.start_step + 1, c.steps + 1):
                    if _any_rank(stop.requested):  # between steps: the state in memory is that step `done` left
                        if done > saved:
                            self.checkpoint(done)
                            saved = done
                        raise RunInterrupted(done, saved or None, self.run_dir)
                    row = self.train_step(step)
                    if c.eval_every and (step % c.eval_every == 0 or step == c.steps):
                        row.update(self.eval_metrics())
                        self.log_samples(step)
                    self.tracker.log(row)
                    done = step
                    if step == c.steps or (c.save_every and step % c.save_every == 0):
                        self.checkpoint(step)
                        saved = step
                if self.start_step < c.steps:  # the trained policy as a Hugging Face folder: run_dir/final
                    self.engine.export(c.tokenizer, c.run_dir / "final", c.rank)
            except KeyboardInterrupt:  # the second Ctrl-C: the state in memory may be mid-step, keep the disk's
                raise RunInterrupted(done, saved or None, self.run_dir) from None
            except Exception as e:
                if not stop.requested or isinstance(e, (RunInterrupted, TrainingError, ConfigError)):
                    raise
                # after a Ctrl-C: it also stopped a child (vLLM's engine), so the step could not finish
                raise RunInterrupted(done, saved or None, self.run_dir) from None
            finally:
                self.tracker.close()
                self.reward.close()
                _close(self.advantage)  # a stage with a process of its own (the distill teacher's worker)
                if c.cluster is not None:  # Ray workers stop with the run (and the local Ray it started)
                    c.cluster.close()
        barrier()
        return self.run_dir

    def close(self) -> None:
        self.source.close()
        self.reward.close()
        _close(self.advantage)
        if self.c.cluster is not None:
            self.c.cluster.close()
        gc.unfreeze()  # let a process that goes on (tests, notebooks) collect this trainer


def nothing_to_train(batch) -> str | None:
    """None when some rank's batch has a loss token; otherwise why none has (the step trains nothing, and a run of
    such steps is stopped by `TrainState.record_step` instead of exiting 0 having learnt nothing)."""
    counts = all_reduce_sum(torch.tensor([float(batch.loss_mask.sum()), float(len(batch)), float(batch.valid.sum()),
                                          float((batch.response_mask.sum(-1) > 0).sum()),
                                          float(batch.finished.sum())], dtype=torch.float64, device="cpu")).tolist()
    tokens, n, valid, with_tokens, finished = (int(x) for x in counts)
    if tokens:
        return None
    saturated = sorted(k for k, v in batch.metrics.items() if k.endswith("_frac") and v == 1.0)
    return (f"no sample has a token to train on: {valid} of {n} have a valid reward, {with_tokens} have a response "
            f"token, {finished} ended before the length cap" + (f"; {', '.join(saturated)} = 1.0" if saturated else ""))


def _close(stage) -> None:
    """Stop what a stage started (it has `close()`: e.g. the distillation teacher's own process); safe to repeat."""
    close = getattr(stage, "close", None)
    if close is not None:
        close()


def _any_rank(flag: bool) -> bool:
    """True when `flag` is set on any rank (every rank must stop at the same step)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return bool(all_reduce_sum(torch.tensor([float(flag)])).item() > 0)
    return flag


def _peak_rss_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def train(r: Recipe) -> Path:
    trainer = Trainer(r)
    try:
        return trainer.fit()
    finally:
        trainer.close()
