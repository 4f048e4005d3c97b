"""Reward functions for end-to-end tests (imported by recipes as reward.function=tests.e2e.rewards:NAME)."""

import threading

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


def wrong_length(responses, problems):
    return [1.0] * (len(responses) + 1)
