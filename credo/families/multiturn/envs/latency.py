"""Simulated env step latency for the built-in games (`env.kwargs.latency_s`): what a real environment (a sandbox,
a web page, a tool call) costs between two model turns, so trajectory-level asynchrony can be measured on CPU.

Each `step` sleeps a log-normal time: median `latency_s`, log-space standard deviation `latency_sigma` (mean
latency_s * exp(sigma^2 / 2); sigma = 1 puts one step in twenty above 5x the median: a heavy tail, the case RollArc
targets). The draws come from a private RNG seeded by the episode's env seed, so an episode's latencies are the same
in every run. The warm-up's expert demonstrations play the env without it.
"""

from __future__ import annotations

import math
import random
import time

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)
from credo.families.multiturn.config import LATENCY_KEYS



class SimulatedLatency:
    def __init__(self, median_s: float = 0.0, sigma: float = 1.0):
        if median_s < 0 or sigma < 0:
            raise ConfigError(f"env.kwargs: latency_s = {median_s}, latency_sigma = {sigma}, expected both >= 0")
        self.median_s, self.sigma = median_s, sigma
        self.rng = random.Random(0)

    def reset(self, seed) -> None:
        self.rng = random.Random(f"latency:{seed}")

    def wait(self) -> float:
        """Sleep one step's latency; returns the seconds drawn (0 without latency)."""
        if self.median_s <= 0:
            return 0.0
        seconds = self.rng.lognormvariate(math.log(self.median_s), self.sigma)
        time.sleep(seconds)
        return seconds


def without_latency(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k not in LATENCY_KEYS}
