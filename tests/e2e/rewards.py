"""Reward functions for end-to-end tests (imported by recipes as reward.function=tests.e2e.rewards:NAME)."""

import threading
import zlib

_lock = threading.Lock()


def starts_with_digit(responses, problems):
    """Dense enough that an untrained tiny policy gets mixed rewards within a group."""
    return [1.0 if r[:1].isdigit() else 0.0 for r in responses]


FLAGGED: list[tuple[str, str]] = []
"""(prompt, response) of each sample raises_on_tenth_sample refused, recorded in that sample's own call."""


def raises_on_tenth_sample(responses, problems):
    """Raises when any of its samples hashes to 0 mod 10 (about 10% of samples), as a list-in, list-out function
    that cannot score one input fails its whole call; otherwise starts_with_digit."""
    bad = [zlib.crc32(f"{p.prompt}|{r}".encode()) % 10 == 0 for r, p in zip(responses, problems)]
    if any(bad):
        if len(responses) == 1:
            with _lock:
                FLAGGED.append((problems[0].prompt, responses[0]))
        raise RuntimeError(f"injected reward failure on {sum(bad)} of {len(responses)} samples")
    return starts_with_digit(responses, problems)


def wrong_length(responses, problems):
    return [1.0] * (len(responses) + 1)
