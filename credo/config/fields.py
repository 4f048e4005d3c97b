"""Field helpers of the recipe schema: each field's valid range declared beside it, checked at load.

    checked(default, check, expected)   any predicate, `expected` words the valid values for the error
    ranged(60, ge=1)                    numeric bounds: '>= 1'; ranged(1.0, gt=0, le=1): 'in (0, 1]'
    one_of('hf', ('hf', 'vllm'))        a fixed set of values: 'hf or vllm'

Families declare their own sections with the same helpers (`from credo.config import ranged`).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Callable


def checked(default: Any, check: Callable[[Any], bool], expected: str, *, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field whose value must pass `check`; `expected` words the valid values for the error."""
    meta = {"check": check, "expected": expected}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def ranged(default: Any, *, ge: Any = None, gt: Any = None, le: Any = None, lt: Any = None, note: str = "") -> Any:
    """A numeric field with bounds: `ranged(60, ge=1)` expects '>= 1', `ranged(1.0, gt=0, le=1)` 'in (0, 1]'."""
    lo, lo_open = (gt, True) if gt is not None else (ge, False)
    hi, hi_open = (lt, True) if lt is not None else (le, False)

    def check(v: Any) -> bool:
        above = lo is None or (v > lo if lo_open else v >= lo)
        below = hi is None or (v < hi if hi_open else v <= hi)
        return above and below

    if lo is not None and hi is not None:
        expected = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    else:
        expected = f"{'>' if lo_open else '>='} {lo}" if lo is not None else f"{'<' if hi_open else '<='} {hi}"
    return checked(default, check, f"{expected} ({note})" if note else expected)


def one_of(default: Any, choices: tuple) -> Any:
    """A field that takes one of a fixed set of values: `one_of('hf', ('hf', 'vllm'))` expects 'hf or vllm'."""
    words = [str(c) for c in choices]
    return checked(default, lambda v: v in choices, ", ".join(words[:-1]) + " or " + words[-1])


def two_betas(b: list) -> bool:
    return len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b)



def resource_request(value: Any) -> bool:
    """A Ray resource request: {name: amount > 0}, e.g. {CPU: 1}, {GPU: 1}, {decode_gpu: 1}."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in value.items())


def ray_address(value: Any) -> bool:
    """'' (start a local Ray), 'auto', 'host:port' or 'ray://host:port'."""
    import re

    return value in ("", "auto") or bool(re.fullmatch(r"(ray://)?[\w.\-]+:\d+", value))


def kind_mismatch(key: str, value: Any, default: Any) -> str:
    """'' when `value` is of the kind of its keyword's `default` (a bool for a bool, a number for a number, a
    string for a string; anything when the default is None or absent); else the error naming `key`. A string
    where a number goes would otherwise pass `credo check` and fail inside the run, after the warm-up."""
    if value is None:  # null: the function decides (many a keyword is Optional)
        return ""
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, (int, float)):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    else:
        return ""
    return "" if ok else f"config key '{key}' = {value!r}: expected {want} (its default is {default!r})"
