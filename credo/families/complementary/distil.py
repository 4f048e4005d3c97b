"""Distil and pair: the part of the Complementary RL loop (arXiv 2603.17621) that both extractor modes share.

    choose    one finished episode (preferring one shown no lesson) of each of `extract_per_step` games
    sample    `candidates` lessons per chosen episode from the extractor's prompt (extractor.trajectory_prompt),
              with the extractor's backend: the second model's (extractor: model / frozen) or the actor's own
              (extractor: self)
    pair      the actor plays `paired_episodes` episodes of each chosen episode's env seed per arm: the baseline
              arm (the task's current entry, or no lesson) and one arm per candidate, with the same sampling seeds
              in every arm; a candidate's reward is its paired gain (credit.paired_gain)
    consolidate  the best candidate of each episode is added, merged or replaces the entry (bank.consolidate)

Seeds of the lesson sampling and of the paired episodes are functions of (run seed, step), so a resumed run
replays them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from credo.families.complementary.credit import paired_gain
from credo.families.complementary.extractor import clean_lesson, trajectory_prompt
from credo.families.complementary.source import strip_note
from credo.train.rollout import step_seed


@dataclass
class Distilled:
    """The lessons of one step and their paired gains. T chosen episodes x C candidates."""

    metas: list[dict]
    """[T] the chosen episodes' meta (task_key, env_seed, ...)."""
    prompts: list[str]
    """[T] the extractor's prompt of each chosen episode."""
    outputs: list
    """[T * C] the backend's samples of the lessons (token ids, sampler log-probs), episode-major."""
    lessons: list[list[tuple[str, list[int]]]]
    """[T][C] (stored text, token ids) of each lesson."""
    gains: torch.Tensor
    """[T, C] float: each lesson's paired gain."""
    metrics: dict[str, float]
    """extractor/* metrics of the step."""


def chosen_episodes(seed: int, step: int, samples: list, valid: list[bool], k: int) -> list[int]:
    """One finished episode (preferring one shown no lesson) of each of `k` games, games in a random order seeded
    by (run seed, step). `valid[i]`: episode i finished without an env failure."""
    by_game: dict[int, list[int]] = {}
    for i, (s, ok) in enumerate(zip(samples, valid)):
        if ok:
            by_game.setdefault(s.meta["game"], []).append(i)
    games = sorted(by_game)
    random.Random(step_seed(seed, step, 7)).shuffle(games)
    out = []
    for g in games[:k]:
        rows = by_game[g]
        out.append(next((i for i in rows if samples[i].meta["experience"] is None), rows[0]))
    return out


def sample_lessons(backend, tokenizer, prompts: list[str], *, candidates: int, max_tokens: int, temperature: float,
                   seeds: list[int]) -> tuple[list, list[list[tuple[str, list[int]]]]]:
    """`candidates` lessons per prompt, in one generate call: the backend's samples ([P * C], prompt-major) and per
    prompt a list of (text, token ids)."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(candidates)]
    outs = backend.generate(ids, max_new_tokens=max_tokens, temperature=temperature, top_p=1.0, seeds=seeds)
    texts = [(clean_lesson(tokenizer.decode(o.response_ids, skip_special_tokens=True)), list(o.response_ids))
             for o in outs]
    return outs, [texts[i * candidates:(i + 1) * candidates] for i in range(len(prompts))]


def distil_and_pair(src, backend, tokenizer, c, *, seed: int, step: int, samples: list, problems: list,
                    rows: list[int]) -> Distilled:
    """Sample the lessons of the chosen episodes `rows` with `backend` and measure each on paired episodes that the
    source `src` plays (the actor). `c`: the complementary section."""
    metas = [samples[i].meta for i in rows]
    prompts = [trajectory_prompt(strip_note(problems[i].prompt), m["actions"], m["observations"])
               for i, m in zip(rows, metas)]
    C, M = c.candidates, c.paired_episodes
    seeds = [step_seed(seed, step, 10**6 + k) for k in range(len(rows) * C)]
    outs, lessons = sample_lessons(backend, tokenizer, prompts, candidates=C, max_tokens=c.lesson_tokens,
                                   temperature=c.extractor_temperature, seeds=seeds)
    env_seeds, notes, sample_seeds = [], [], []
    for t, m in enumerate(metas):
        entry = src.lookup(m["task_key"])
        pair_seeds = [step_seed(seed, step, 2 * 10**6 + t * M + j) for j in range(M)]
        for note in [entry.text if entry else ""] + [text for text, _ in lessons[t]]:
            env_seeds += [m["env_seed"]] * M
            notes += [note] * M
            sample_seeds += pair_seeds
    returns, valid = src.play(env_seeds, notes, sample_seeds)
    R = torch.tensor(returns).view(len(rows), C + 1, M)
    V = torch.tensor(valid).view(len(rows), C + 1, M)
    gains = torch.stack([paired_gain(R[t, 1:], R[t, 0], V[t, 1:] & V[t, :1]) for t in range(len(rows))])  # [T, C]
    metrics = {"extractor/episodes": len(rows), "extractor/reward_mean": float(gains.mean()),
               "extractor/reward_best_mean": float(gains.max(-1).values.mean()),
               "extractor/base_return": float(R[:, 0].mean()), "extractor/with_return": float(R[:, 1:].mean()),
               "extractor/empty_lessons": sum(not text for ls in lessons for text, _ in ls)}
    return Distilled(metas, prompts, outs, lessons, gains, metrics)


def consolidate(bank, task_keys: list[str], texts: list[list[str]], gains: torch.Tensor, step: int) -> None:
    """Each chosen episode's best candidate (the first of the highest paired gain) into the bank; an empty lesson
    is never stored. task_keys: [T]; texts: [T][C]; gains: [T, C]."""
    for t, key in enumerate(task_keys):
        best = int(gains[t].argmax())
        if texts[t][best]:
            bank.consolidate(key, texts[t][best], float(gains[t, best]), step)
