"""The Complementary RL step hook (arXiv 2603.17621): after the actor's update and weight sync,

    1. observe   each shown entry's help on the actor's own batch (its game's with-lesson episodes minus the
                 without-lesson ones, credit.with_minus_without) moves the entry's score
    2. distil    the extractor samples `candidates` lessons from each of `extract_per_step` finished episodes
    3. pair      the actor plays `paired_episodes` episodes of each distilled episode's env seed per arm: the
                 baseline arm (the task's current entry, or no lesson) and one arm per candidate, with the same
                 sampling seeds in every arm; a candidate's reward is its paired gain (credit.paired_gain)
    4. train     extractor: model -> one GRPO step of the extractor on those rewards (its own optimizer);
                 frozen -> none (a static extractor)
    5. consolidate  the best candidate of each episode is added, merged or replaces the entry (bank.consolidate);
                 then entries that stopped helping, and any over capacity, are deleted (bank.prune)

The synchronous CPU path runs all of this in the trainer's process after the sync, so a step's wall time is the
actor's step plus the extractor's (perf/complementary_s); the paired episodes are batched into one generate call per
turn. Nothing here depends on the order of other work in the step, so with `complementary.extractor_async: true`
`ExtractorHook.after_sync` instead runs steps 1-5 in a worker thread beside the actor's next step, on copies of the
bank and of the actor (beside.py): the actor is then shown a bank exactly one step older.

With `complementary.extractor: self` (one model) steps 2-4 happen inside the actor's rollout instead (source.py):
the actor samples the lessons, they are paired there, and they train in the actor's own update; `BankHook` then
does steps 1 and 5 from the batch.

`ExtractorHook` owns the extractor's engine: `state_dict` / `load_state_dict` copy it in memory (rollback),
`save_files` / `load_files` write it as a DeepSpeed checkpoint inside the trainer's (exact resume). Its sampling
and pairing seeds are functions of (run seed, step), so nothing else needs saving; the bank is the source's state.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from credo.distributed.engine import engine_state_dict, load_engine_state_dict, param_digests, reapply_optimizer_settings
from credo.families.complementary.credit import with_minus_without
from credo.families.complementary.distil import chosen_episodes, consolidate, distil_and_pair
from credo.families.complementary.extractor import extractor_update

CKPT_TAG = "state"


class BankHook:
    """Steps 1 and 5 (observe, consolidate, prune) of the one-model mode (`complementary.extractor: self`): the
    rollout source already sampled the lessons with the actor and measured them (source.py), and the actor's update
    trained on them; this hook stores each chosen episode's best lesson from the batch's lesson samples. It holds
    no state (the bank is the source's)."""

    name = "complementary"

    def __init__(self, source, section):
        self.source, self.c = source, section

    def before_step(self, step: int) -> None:
        pass

    def after_sync(self, step: int, batch) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = self.work(step, batch, self.source)
        metrics["perf/complementary_s"] = time.perf_counter() - t0
        return metrics

    def work(self, step: int, batch, src) -> dict[str, float]:
        """Steps 1-5 on `src`'s bank: the source itself, or (extractor_async) the worker's view of it (beside.py)."""
        bank = src.bank
        before = dict(bank.counts)
        metrics = self.observe(batch, src)
        metrics.update(self.distil(step, batch, src))
        bank.prune()
        metrics.update({f"bank/{op}s": bank.counts[op] - before[op] for op in ("add", "merge", "replace", "delete")})
        metrics["bank/size"] = len(bank)
        metrics["bank/score_mean"] = (sum(e.score for e in bank.entries.values()) / len(bank)) if len(bank) else 0.0
        return metrics

    # ---- 1. an entry's help on the actor's batch (its episodes only: lesson samples have meta['lesson'])
    def observe(self, batch, src) -> dict[str, float]:
        rows = [i for i, s in enumerate(batch.samples) if "lesson" not in s.meta]
        metas = [batch.samples[i].meta for i in rows]
        valid = batch.valid.tolist()
        returns = [float(sum(m["turn_rewards"])) for m in metas]
        gains = with_minus_without(returns, [m["game"] for m in metas], [m["experience"] is not None for m in metas],
                                   [valid[i] for i in rows])
        shown = {m["game"]: (m["task_key"], m["experience"]) for m in metas if m["experience"] is not None}
        for game, gain in gains.items():
            key, exp = shown[game]
            entry = src.bank.retrieve(key) if self.c.retrieval == "task" else None
            if entry is not None and (entry.id, entry.version) == (exp["id"], exp["version"]):
                src.bank.observe(key, gain)
        return {"complementary/with_minus_without": sum(gains.values()) / len(gains)} if gains else {}

    # ---- 5. the lessons the source sampled and paired in this step's rollout
    def distil(self, step: int, batch, src) -> dict[str, float]:
        lessons = [s.meta["lesson"] for s in batch.samples if "lesson" in s.meta]
        if not lessons:
            return {}
        T, C = 1 + max(x["episode"] for x in lessons), self.c.candidates
        gains, texts, keys = torch.zeros(T, C), [[""] * C for _ in range(T)], [""] * T
        for x in lessons:
            gains[x["episode"], x["candidate"]] = x["gain"]
            texts[x["episode"]][x["candidate"]] = x["text"]
            keys[x["episode"]] = x["task_key"]
        consolidate(src.bank, keys, texts, gains, step)
        return {}


class ExtractorHook(BankHook):
    """Steps 1-5 with the extractor as a second model (`complementary.extractor: model` or `frozen`)."""

    def __init__(self, source, engine, backend, tokenizer, section, *, seed: int, zero_stage: int, world: int,
                 beside=None):
        super().__init__(source, section)
        self.engine, self.backend, self.tokenizer = engine, backend, tokenizer
        self.seed, self.zero_stage, self.world = seed, zero_stage, world
        self.beside = beside
        """extractor_async: (Beside, the actor's copy, the actor's live module, the copy's backend); else None."""
        if beside is not None:
            source.beside = beside[0]

    def after_sync(self, step: int, batch) -> dict[str, float]:
        if self.beside is None:
            return super().after_sync(step, batch)
        from credo.families.complementary.beside import worker_source

        worker, actor_copy, actor, actor_backend = self.beside
        t0 = time.perf_counter()
        done = worker.take()  # the work on step - 1's batch, run beside this step
        metrics = {"perf/complementary_wait_s": time.perf_counter() - t0}
        if done is not None:
            self.source.install(done.bank, done.step)
            metrics.update({k: v for k, v in done.metrics.items() if not k.startswith("perf/")})
            metrics["perf/complementary_beside_s"] = done.metrics["perf/complementary_beside_s"]
        actor_copy.sync_from(actor)  # the weights after this step's update (the trainer's module moves on)
        bank = copy.deepcopy(self.source.bank)
        view = worker_source(self.source, bank, actor_backend, self.tokenizer)

        def work() -> dict[str, float]:
            t = time.perf_counter()
            out = self.work(step, batch, view)
            out["perf/complementary_beside_s"] = time.perf_counter() - t
            return out

        worker.submit(step, bank, work)
        return metrics

    # ---- 2-5
    def distil(self, step: int, batch, src) -> dict[str, float]:
        c = self.c
        rows = chosen_episodes(self.seed, step, batch.samples, batch.valid.tolist(), c.extract_per_step)
        if not rows:
            return {"extractor/episodes": 0}
        d = distil_and_pair(src, self.backend, self.tokenizer, c, seed=self.seed, step=step,
                            samples=batch.samples, problems=batch.problems, rows=rows)
        out, C = dict(d.metrics), c.candidates
        if c.extractor == "model":
            out.update(extractor_update(
                self.engine, self.tokenizer, [p for p in d.prompts for _ in range(C)],
                [ids for ls in d.lessons for _, ids in ls], d.gains.flatten(),
                torch.arange(len(rows)).repeat_interleave(C), zero_stage=self.zero_stage, world=self.world))
        consolidate(src.bank, [m["task_key"] for m in d.metas], [[t for t, _ in ls] for ls in d.lessons],
                    d.gains, step)
        return out

    # ---- state: the extractor's engine (extractor_async: after the work in flight, which trains it, is joined)
    def join(self) -> None:
        if self.beside is not None:
            self.beside[0].join()

    def state_dict(self) -> dict:
        self.join()
        return {"extractor": engine_state_dict(self.engine)}

    def load_state_dict(self, state: dict) -> None:
        self.join()
        load_engine_state_dict(self.engine, state["extractor"])

    def save_files(self, folder: Path) -> dict:
        from credo.errors import TrainingError

        self.join()
        self.engine.save_checkpoint(str(folder / "extractor"), tag=CKPT_TAG, save_latest=False)
        digests = param_digests(self.engine.module)
        if len(set(digests)) > 1:
            raise TrainingError(f"data-parallel ranks hold different parameters of the extractor: {digests}")
        return {"param_digests": digests}

    def load_files(self, folder: Path) -> None:
        self.join()
        path, _ = self.engine.load_checkpoint(str(folder / "extractor"), tag=CKPT_TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the extractor from {folder / 'extractor'}")
        reapply_optimizer_settings(self.engine)
