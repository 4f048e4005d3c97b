"""A built-in Mastermind-lite with GEM's protocol and no extra packages: find a hidden code of `positions`
digits over colours 1..`colours` (default 2 x 3: 9 codes) from black/white peg feedback.

    reset(seed) -> ("code 2x1-3", {"suffix": ""})
    step("12")  -> ("1b0w", 0.0, False, False, info)     one digit right in its place, none misplaced
    step("13")  -> ("2b0w", 1.0, True, False, info)      solved

Feedback `<B>b<W>w`: B digits right in their place (black pegs), W more digits right in the wrong place (white
pegs: the multiset overlap of guess and code, less B). Rewards follow the built-in guess game and GEM's
`LanguageGameReward`: 1 for solving, 0 for every other turn, -0.1 and termination for an action with no
parsable code (the last run of `positions` in-range digits in the text), truncation with 0 after `max_turns`.
GEM's Mastermind gives partial rewards per peg; this game does not (an inferred simplification).

`expert_action` is the warm-up's demonstrator: the first code (in counting order) consistent with all the
feedback so far, which solves every 2 x 3 code within 4 guesses; with probability `noise` a uniform random code.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)
from credo.families.multiturn.envs.latency import SimulatedLatency


def pegs(guess: tuple[int, ...], code: tuple[int, ...]) -> tuple[int, int]:
    """(black, white) pegs of `guess` against `code`."""
    black = sum(g == c for g, c in zip(guess, code))
    overlap = sum((Counter(guess) & Counter(code)).values())
    return black, overlap - black


class MastermindEnv:
    """Find a code of `positions` digits in 1..`colours` within `max_turns` guesses from peg feedback."""

    def __init__(self, positions: int = 2, colours: int = 3, max_turns: int = 4, latency_s: float = 0.0,
                 latency_sigma: float = 1.0):
        if not 1 <= colours <= 9:
            raise ConfigError(f"env.kwargs.colours = {colours}, expected 1..9 (one digit per colour)")
        if positions < 1 or max_turns < 1:
            raise ConfigError(f"env.kwargs: positions = {positions}, max_turns = {max_turns}, expected both >= 1")
        self.positions, self.colours, self.max_turns = positions, colours, max_turns
        self.codes = list(itertools.product(range(1, colours + 1), repeat=positions))
        self.action = re.compile(f"[1-{colours}]{{{positions}}}")
        self.code, self.turn, self.history = self.codes[0], 0, []
        self.latency = SimulatedLatency(latency_s, latency_sigma)  # env.kwargs.latency_s: a simulated step time

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.code = random.Random(seed).choice(self.codes)  # a private RNG: safe from threads
        self.turn, self.history = 0, []
        self.latency.reset(seed)
        return f"code {self.positions}x1-{self.colours}", {"suffix": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.latency.wait()
        self.turn += 1
        found = self.action.findall(action)
        if not found:  # GEM: a format error costs -0.1 and ends the episode
            return "invalid", -0.1, True, False, {"suffix": ""}
        guess = tuple(int(ch) for ch in found[-1])
        black, white = pegs(guess, self.code)
        self.history.append((guess, (black, white)))
        if black == self.positions:
            return f"{black}b0w", 1.0, True, False, {"suffix": ""}
        return f"{black}b{white}w", 0.0, False, self.turn >= self.max_turns, {"suffix": ""}

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The first code consistent with every feedback so far, or (prob. `noise`) a uniform random code."""
        if rng.random() < noise:
            return "".join(str(d) for d in rng.choice(self.codes))
        for code in self.codes:
            if all(pegs(g, code) == fb for g, fb in self.history):
                return "".join(str(d) for d in code)
        raise AssertionError("no code is consistent with the feedback")  # unreachable: the true code always is
