"""A built-in multi-turn text game with GEM's protocol and no extra packages: guess a hidden number.

    reset(seed) -> ("guess 1-7", {"suffix": ""})
    step("4")   -> ("higher", 0.0, False, False, info)        the target is above 4
    step("6")   -> ("lower", 0.0, False, False, info)
    step("5")   -> ("correct", 1.0, True, False, info)

The reward constants follow GEM's games (`gem.utils.constants.LanguageGameReward`): 1 for success, 0 for
every other turn, -0.1 and termination for an action with no parsable number, 0 and a feedback line for a
number out of range; running out of turns truncates the episode with reward 0 (GEM's GuessTheNumber gives a
partial reward there instead). Observations are short so a character-level model reads them cheaply.

`expert_action` is the scripted demonstrator of the supervised warm-up: binary search over the interval the
feedback leaves, or with probability `noise` a uniform guess over the whole range (a noisy expert).
"""

from __future__ import annotations

import random
import re

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)
from credo.families.multiturn.envs.latency import SimulatedLatency

NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv:
    """Guess an integer in [low, high] within `max_turns` guesses from higher/lower feedback."""

    def __init__(self, low: int = 1, high: int = 7, max_turns: int = 3, latency_s: float = 0.0,
                 latency_sigma: float = 1.0):
        if low > high:
            raise ConfigError(f"env.kwargs: low = {low} > high = {high}, expected low <= high")
        if max_turns < 1:
            raise ConfigError(f"env.kwargs.max_turns = {max_turns}, expected >= 1")
        self.low, self.high, self.max_turns = low, high, max_turns
        self.target, self.turn, self.lo, self.hi = low, 0, low, high
        self.latency = SimulatedLatency(latency_s, latency_sigma)  # env.kwargs.latency_s: a simulated step time

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.target = random.Random(seed).randint(self.low, self.high)  # a private RNG: safe from threads
        self.turn, self.lo, self.hi = 0, self.low, self.high
        self.latency.reset(seed)
        return f"guess {self.low}-{self.high}", {"suffix": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.latency.wait()
        self.turn += 1
        found = NUMBER.findall(action)
        if not found:  # GEM: a format error costs -0.1 and ends the episode
            return "invalid", -0.1, True, False, {"suffix": ""}
        guess = int(found[-1])
        if guess == self.target:
            return "correct", 1.0, True, False, {"suffix": ""}
        if not self.low <= guess <= self.high:
            obs = "out of range"
        elif guess < self.target:
            obs, self.lo = "higher", max(self.lo, guess + 1)
        else:
            obs, self.hi = "lower", min(self.hi, guess - 1)
        return obs, 0.0, False, self.turn >= self.max_turns, {"suffix": ""}

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The demonstrator's next guess: the midpoint of what the feedback leaves, or (prob. `noise`) a random one."""
        if rng.random() < noise:
            return str(rng.randint(self.low, self.high))
        return str((self.lo + self.hi) // 2)
