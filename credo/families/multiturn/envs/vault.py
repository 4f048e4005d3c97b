"""A built-in multi-turn game where lessons transfer across episodes: open a vault whose code its task id fixes.

    reset(seed) -> ("vault 3 code 1-9", {"suffix": ""})          task id = seed mod n_tasks; the code is a
    step("5")   -> ("higher", 0.0, False, False, info)            function of (task id, salt) only, so every
    step("7")   -> ("open", 1.0, True, False, info)               episode of task 3 hides the same code

Made for Complementary RL (arXiv 2603.17621, credo/families/complementary/): a lesson such as "code 7" learned from
one episode of a task opens every later vault of that task at the first try, while an actor without it must search
(with 1-9 in 2 turns binary search opens a third of the vaults). Reward constants as the guess game (GEM's): 1 on
opening, 0 otherwise, -0.1 and termination for an action without a number; running out of turns truncates.

Notes: `pin_note(text)` (called by the complementary source before `reset`) shows `note: <text>` above the first
observation. For the warm-up demonstrations, `note_frac` > 0 pins a true note (`code <c>`) on that fraction of resets
that were not pinned, so the scripted expert, which opens with a note's code, teaches the actor to read notes
(inferred: the paper's actor warm-up is not described). `credo check` refuses note_frac > 0 without the complementary
source (the notes would leak the code into a plain run's training).
"""

from __future__ import annotations

import random

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)
from credo.families.multiturn.envs.guess import NUMBER


class VaultEnv:
    """Open a vault of `n_tasks` kinds, code in [low, high], within `max_turns` guesses from higher/lower feedback."""

    def __init__(self, n_tasks: int = 8, low: int = 1, high: int = 9, max_turns: int = 2, salt: int = 0,
                 note_frac: float = 0.0):
        if low > high or n_tasks < 1 or max_turns < 1 or not 0 <= note_frac <= 1:
            raise ConfigError(f"env.kwargs: expected n_tasks >= 1, low <= high, max_turns >= 1, 0 <= note_frac <= 1; "
                             f"got n_tasks={n_tasks}, low={low}, high={high}, max_turns={max_turns}, "
                             f"note_frac={note_frac}")
        self.n_tasks, self.low, self.high, self.max_turns, self.salt = n_tasks, low, high, max_turns, salt
        self.note_frac = note_frac
        self.pinned: str | None = None
        self.note, self.task, self.code, self.turn, self.lo, self.hi = "", 0, low, 0, low, high

    def task_id(self, seed: int) -> str:
        """The task a seed plays (what lessons are keyed by)."""
        return f"vault {seed % self.n_tasks}"

    def code_of(self, task: int) -> int:
        return random.Random(1_000_003 * (task + 1) + 7919 * self.salt).randint(self.low, self.high)

    def pin_note(self, text: str) -> None:
        """Show `note: text` above the next reset's observation ('' = no note, and no warm-up note either)."""
        self.pinned = text

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        seed = 0 if seed is None else seed
        rng = random.Random(seed)  # a private RNG: safe from threads
        self.task = seed % self.n_tasks
        self.code = self.code_of(self.task)
        self.turn, self.lo, self.hi = 0, self.low, self.high
        if self.pinned is not None:
            self.note = self.pinned
        else:
            self.note = f"code {self.code}" if self.note_frac and rng.random() < self.note_frac else ""
        obs = f"vault {self.task} code {self.low}-{self.high}"
        return (f"note: {self.note}\n{obs}" if self.note else obs), {"suffix": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        found = NUMBER.findall(action)
        if not found:
            return "invalid", -0.1, True, False, {"suffix": ""}
        guess = int(found[-1])
        if guess == self.code:
            return "open", 1.0, True, False, {"suffix": ""}
        if not self.low <= guess <= self.high:
            obs = "out of range"
        elif guess < self.code:
            obs, self.lo = "higher", max(self.lo, guess + 1)
        else:
            obs, self.hi = "lower", min(self.hi, guess - 1)
        return obs, 0.0, False, self.turn >= self.max_turns, {"suffix": ""}

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The demonstrator: the note's code on the first turn when the note has one in range, else the midpoint of
        what the feedback leaves; with probability `noise` a uniform guess instead."""
        if rng.random() < noise:
            return str(rng.randint(self.low, self.high))
        noted = [int(x) for x in NUMBER.findall(self.note)]
        if self.turn == 0 and noted and self.low <= noted[-1] <= self.high:
            return str(noted[-1])
        return str((self.lo + self.hi) // 2)

    def lesson_demo(self, actions: list[str], observations: list[str]) -> str:
        """The scripted extractor's lesson from a finished episode of this env (`scripted_lesson`)."""
        return scripted_lesson(actions, observations, self.low, self.high)


def scripted_lesson(actions: list[str], observations: list[str], low: int, high: int) -> str:
    """The scripted extractor's lesson from one finished vault episode (its warm-up demonstration; inferred): the
    code when the episode opened the vault, else the midpoint of the range its feedback leaves."""
    lo, hi = low, high
    for a, o in zip(actions, observations):
        found = NUMBER.findall(a)
        if not found:
            continue
        g = int(found[-1])
        if o == "open":
            return f"code {g}"
        if o == "higher":
            lo = max(lo, g + 1)
        elif o == "lower":
            hi = min(hi, g - 1)
    return f"code {(lo + hi) // 2}"
