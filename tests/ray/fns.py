"""Reward functions and envs the Ray tests ship to workers (a light module: workers import it on first use)."""

from __future__ import annotations

import os
import time

from credo.families.multiturn.envs.guess import GuessNumberEnv


def length_reward(responses, problems):
    """Reward = response length; 'raise' raises, 'hang' sleeps past any test timeout."""
    out = []
    for r in responses:
        if r == "raise":
            raise ValueError("this group's verifier broke")
        if r == "hang":
            time.sleep(120)
        out.append(float(len(r)))
    return out


def claim(marker: str) -> bool:
    """True for the one caller that removes `marker` (the fault happens once, whatever races for it)."""
    try:
        os.remove(marker)
        return True
    except FileNotFoundError:
        return False


class DiesOnce:
    """`length_reward`, but the first call that finds `marker` kills its own process (a worker lost mid-call)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self, responses, problems):
        if claim(self.marker):
            os._exit(1)
        return length_reward(responses, problems)


def always_dies(responses, problems):
    os._exit(1)


class FlakyGuess(GuessNumberEnv):
    """The built-in game, where any text is a guess (its characters' code sum mod 7, plus 1: a random tiny policy
    plays several turns), whose step raises for seeds = 1 mod 4 (a failing env, isolated to its episode), and whose
    process dies once on a step when `marker` exists (an env worker lost mid-step)."""

    def __init__(self, marker: str = "", **kw):
        super().__init__(**kw)
        self.marker, self.seed = marker, None

    def reset(self, seed=None):
        self.seed = seed
        return super().reset(seed)

    def step(self, action):
        if self.marker and claim(self.marker):
            os._exit(1)
        if self.seed is not None and self.seed % 4 == 1:
            raise RuntimeError(f"env broke on seed {self.seed}")
        return super().step(str(sum(map(ord, action)) % 7 + 1))


class DyingGuess(GuessNumberEnv):
    """The built-in game whose every step kills its process (an env worker that keeps dying)."""

    def step(self, action):
        os._exit(1)


class DiesStarting(GuessNumberEnv):
    """The built-in game whose constructor kills its process once when `marker` exists: an env worker builds one
    env when it starts (its probe), so a replacement started after the marker is made dies while starting."""

    def __init__(self, marker: str = "", **kw):
        if marker and claim(marker):
            os._exit(1)
        super().__init__(**kw)
