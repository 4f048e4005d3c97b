"""TRL-style reward functions, as a TRL user writes them (recipes name them as tests.byo.rewards:NAME)."""

import threading

CALLS: list[dict] = []  # what the functions received, for the tests that check the calling convention
_lock = threading.Lock()


def _text(c):
    return c[0]["content"] if isinstance(c, list) else c


def has_digit(completions, **kwargs):
    """1.0 when the completion holds a digit."""
    with _lock:
        CALLS.append({"fn": "has_digit", **{k: v for k, v in kwargs.items()}, "completions": completions})
    return [1.0 if any(ch.isdigit() for ch in _text(c)) else 0.0 for c in completions]


def length_penalty(prompts, completions, completion_ids, answer, level, **kwargs):
    """-0.1 per completion token, and None (does not apply) where level == 2."""
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer) == len(level)
    return [None if lv == 2 else -0.1 * len(ids) for ids, lv in zip(completion_ids, level)]


def named_only(completions, answer):
    """No **kwargs: receives only the keywords it names."""
    return [1.0 if _text(c).strip() == a else 0.0 for c, a in zip(completions, answer)]
