"""Reward functions for the reliability tests (recipes name them as tests.reliability.rewards:NAME)."""

import threading
import time

from tests.e2e.rewards import starts_with_digit


def slow_starts_with_digit(responses, problems):
    """starts_with_digit after 0.2 s, so a step lasts long enough for a test to kill the run inside it."""
    time.sleep(0.2)
    return starts_with_digit(responses, problems)


_lock = threading.Lock()
SLEPT: list[bool] = []
"""One entry per call of sleeps_on_even_prompt, in call order: whether it slept past the timeout."""


def sleeps_on_even_prompt(responses, problems):
    """Sleeps 1.5 s (past a short reward.timeout_s) when the prompt starts with an even digit, else scores.

    Each call is recorded in SLEPT before it sleeps, so a test knows how many calls had to time out.
    """
    slow = problems[0].prompt[:1] in "02468"
    with _lock:
        SLEPT.append(slow)
    if slow:
        time.sleep(1.5)
    return starts_with_digit(responses, problems)
