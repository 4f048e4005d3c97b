"""Reward functions for end-to-end tests (imported by recipes as reward.function=tests.e2e.rewards:NAME)."""

import threading
import time

_lock = threading.Lock()
_calls = {"n": 0}


def starts_with_digit(responses, problems):
    """Dense enough that an untrained tiny policy gets mixed rewards within a group."""
    return [1.0 if r[:1].isdigit() else 0.0 for r in responses]


def raises_every_tenth(responses, problems):
    """Raises on calls 0, 10, 20, ... (10% of calls), otherwise starts_with_digit."""
    with _lock:
        n = _calls["n"]
        _calls["n"] += 1
    if n % 10 == 0:
        raise RuntimeError(f"injected reward failure on call {n}")
    return starts_with_digit(responses, problems)


def sleeps_on_first_group(responses, problems):
    """Sleeps past any short timeout when the first prompt's digit sum is even; otherwise scores."""
    if problems[0].prompt.startswith(("0", "2", "4", "6", "8")):
        time.sleep(3.0)
    return starts_with_digit(responses, problems)


def wrong_length(responses, problems):
    return [1.0] * (len(responses) + 1)


def not_a_number(responses, problems):
    return ["high"] * len(responses)


def first_char_is_one(responses, problems):
    """An easy preference a policy learns in a few steps: the response starts with '1'."""
    return [1.0 if r.startswith("1") else 0.0 for r in responses]
