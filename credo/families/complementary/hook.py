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
turn. Nothing here depends on the order of other work in the step, so an asynchronous runner can move steps 2-5
beside the next rollout (a bank one step older is then shown); that is not built here.

The hook owns the extractor's engine: `state_dict` / `load_state_dict` copy it in memory (rollback), `save_files` /
`load_files` write it as a DeepSpeed checkpoint inside the trainer's (exact resume). Its sampling and pairing seeds
are functions of (run seed, step), so nothing else needs saving; the bank is the source's state.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from credo.distributed.engine import engine_state_dict, load_engine_state_dict, param_digests, reapply_optimizer_settings
from credo.families.complementary.credit import paired_gain, with_minus_without
from credo.families.complementary.extractor import extractor_update, sample_lessons, trajectory_prompt
from credo.families.complementary.source import strip_note
from credo.train.rollout import step_seed

CKPT_TAG = "state"


class ExtractorHook:
    name = "complementary"

    def __init__(self, source, engine, backend, tokenizer, section, *, seed: int, zero_stage: int, world: int):
        self.source, self.engine, self.backend, self.tokenizer, self.c = source, engine, backend, tokenizer, section
        self.seed, self.zero_stage, self.world = seed, zero_stage, world

    def before_step(self, step: int) -> None:
        pass

    def after_sync(self, step: int, batch) -> dict[str, float]:
        t0 = time.perf_counter()
        bank = self.source.bank
        before = dict(bank.counts)
        metrics = self.observe(batch)
        metrics.update(self.distil(step, batch))
        bank.prune()
        metrics.update({f"bank/{op}s": bank.counts[op] - before[op] for op in ("add", "merge", "replace", "delete")})
        metrics["bank/size"] = len(bank)
        metrics["bank/score_mean"] = (sum(e.score for e in bank.entries.values()) / len(bank)) if len(bank) else 0.0
        metrics["perf/complementary_s"] = time.perf_counter() - t0
        return metrics

    # ---- 1. an entry's help on the actor's batch
    def observe(self, batch) -> dict[str, float]:
        metas = [s.meta for s in batch.samples]
        returns = [float(sum(m["turn_rewards"])) for m in metas]
        gains = with_minus_without(returns, [m["game"] for m in metas], [m["experience"] is not None for m in metas],
                                   batch.valid.tolist())
        shown = {m["game"]: (m["task_key"], m["experience"]) for m in metas if m["experience"] is not None}
        for game, gain in gains.items():
            key, exp = shown[game]
            entry = self.source.bank.retrieve(key) if self.c.retrieval == "task" else None
            if entry is not None and (entry.id, entry.version) == (exp["id"], exp["version"]):
                self.source.bank.observe(key, gain)
        return {"complementary/with_minus_without": sum(gains.values()) / len(gains)} if gains else {}

    # ---- 2-5
    def chosen_episodes(self, step: int, batch) -> list[int]:
        """One finished episode (preferring one shown no lesson) of each of `extract_per_step` games, games in a
        random order seeded by (run seed, step)."""
        by_game: dict[int, list[int]] = {}
        for i, (s, ok) in enumerate(zip(batch.samples, batch.valid.tolist())):
            if ok:
                by_game.setdefault(s.meta["game"], []).append(i)
        games = sorted(by_game)
        random.Random(step_seed(self.seed, step, 7)).shuffle(games)
        out = []
        for g in games[:self.c.extract_per_step]:
            rows = by_game[g]
            out.append(next((i for i in rows if batch.samples[i].meta["experience"] is None), rows[0]))
        return out

    def distil(self, step: int, batch) -> dict[str, float]:
        c, src = self.c, self.source
        rows = self.chosen_episodes(step, batch)
        if not rows:
            return {"extractor/episodes": 0}
        metas = [batch.samples[i].meta for i in rows]
        prompts = [trajectory_prompt(strip_note(batch.problems[i].prompt), m["actions"], m["observations"])
                   for i, m in zip(rows, metas)]
        C, M = c.candidates, c.paired_episodes
        seeds = [step_seed(self.seed, step, 10**6 + k) for k in range(len(rows) * C)]
        lessons = sample_lessons(self.backend, self.tokenizer, prompts, candidates=C, max_tokens=c.lesson_tokens,
                                 temperature=c.extractor_temperature, seeds=seeds)
        env_seeds, notes, sample_seeds = [], [], []
        for t, m in enumerate(metas):
            entry = src.lookup(m["task_key"])
            pair_seeds = [step_seed(self.seed, step, 2 * 10**6 + t * M + j) for j in range(M)]
            for note in [entry.text if entry else ""] + [text for text, _ in lessons[t]]:
                env_seeds += [m["env_seed"]] * M
                notes += [note] * M
                sample_seeds += pair_seeds
        returns, valid = src.play(env_seeds, notes, sample_seeds)
        R = torch.tensor(returns).view(len(rows), C + 1, M)
        V = torch.tensor(valid).view(len(rows), C + 1, M)
        gains = torch.stack([paired_gain(R[t, 1:], R[t, 0], V[t, 1:] & V[t, :1]) for t in range(len(rows))])  # [T, C]
        out = {"extractor/episodes": len(rows), "extractor/reward_mean": float(gains.mean()),
               "extractor/reward_best_mean": float(gains.max(-1).values.mean()),
               "extractor/base_return": float(R[:, 0].mean()), "extractor/with_return": float(R[:, 1:].mean()),
               "extractor/empty_lessons": sum(not text for ls in lessons for text, _ in ls)}
        if c.extractor == "model":
            out.update(extractor_update(
                self.engine, self.tokenizer, [p for p in prompts for _ in range(C)],
                [ids for ls in lessons for _, ids in ls], gains.flatten(),
                torch.arange(len(rows)).repeat_interleave(C), zero_stage=self.zero_stage, world=self.world))
        for t, m in enumerate(metas):
            best = int(gains[t].argmax())
            text = lessons[t][best][0]
            if text:
                src.bank.consolidate(m["task_key"], text, float(gains[t, best]), step)
        return out

    # ---- state: the extractor's engine
    def state_dict(self) -> dict:
        return {"extractor": engine_state_dict(self.engine)}

    def load_state_dict(self, state: dict) -> None:
        load_engine_state_dict(self.engine, state["extractor"])

    def save_files(self, folder: Path) -> dict:
        from credo.errors import TrainingError

        self.engine.save_checkpoint(str(folder / "extractor"), tag=CKPT_TAG, save_latest=False)
        digests = param_digests(self.engine.module)
        if len(set(digests)) > 1:
            raise TrainingError(f"data-parallel ranks hold different parameters of the extractor: {digests}")
        return {"param_digests": digests}

    def load_files(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(folder / "extractor"), tag=CKPT_TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the extractor from {folder / 'extractor'}")
        reapply_optimizer_settings(self.engine)
