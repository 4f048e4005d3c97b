"""Reward calls isolated from the run: a per-call timeout, failures masked and counted, never fatal alone.

A reward function is called once per group (the responses to one prompt) as
`fn(responses: list[str], problems: list[Problem]) -> list[float]`, so an LLM judge that compares a
group's responses drops in as is. A call that raises or times out marks its samples invalid: the trainer
masks them from the loss and counts them in `train/reward_failures`. Returning the wrong length or a
non-number is a bug in the reward function, not a transient failure, and stops the run with an error
naming the function.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from credo.config import ConfigError

log = logging.getLogger("credo.rewards")

GroupRewardFn = Callable[[list, list], Sequence[float]]


class RewardFunctionError(RuntimeError):
    """The reward function broke its contract (wrong length, a non-number) or failed too often."""


@dataclass
class RewardResult:
    rewards: list[float]
    """One reward per sample; 0.0 where the call failed."""
    valid: list[bool]
    """False for samples whose reward call raised or timed out."""
    failures: int
    """Calls that raised."""
    timeouts: int
    """Calls that timed out."""


def per_sample(score: Callable) -> GroupRewardFn:
    """Lift a verifier `score(response, problem) -> float` to the group interface."""

    def group_fn(responses: list, problems: list) -> list[float]:
        return [score(r, p) for r, p in zip(responses, problems)]

    group_fn.__name__ = getattr(score, "__name__", "score")
    return group_fn


def import_reward_fn(spec: str) -> GroupRewardFn:
    """Import `package.module:function` (the recipe's `reward.function`)."""
    if ":" not in spec:
        raise ConfigError(f"reward.function = '{spec}': expected 'module:function'")
    mod, name = spec.split(":", 1)
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to the recipe's working directory import
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"reward.function = '{spec}' cannot be imported: {e}") from None
    if not callable(fn):
        raise ConfigError(f"reward.function = '{spec}' is not callable")
    return fn


def _run_with_timeout(fn: Callable, args: tuple, timeout_s: float):
    """Run fn(*args) in a daemon thread; return ('ok', value) | ('error', exc) | ('timeout', None).

    A thread cannot be killed: a call past its timeout is abandoned and finishes in the background.
    """
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - any failure of user code is isolated
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return "timeout", None
    if "error" in box:
        return "error", box["error"]
    return "ok", box["value"]


class RewardWorker:
    """Evaluates groups of responses with a per-call timeout and failure accounting."""

    def __init__(self, fn: GroupRewardFn, *, timeout_s: float, workers: int, max_failure_frac: float):
        self.fn = fn
        self.timeout_s = timeout_s
        self.max_failure_frac = max_failure_frac
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="credo-reward")
        self._seen_kinds: set[str] = set()
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))

    def _check(self, value, n: int) -> list[float]:
        try:
            values = list(value)
        except TypeError:
            raise RewardFunctionError(
                f"reward function '{self.name}' returned {type(value).__name__}; expected a list of {n} numbers"
            ) from None
        if len(values) != n:
            raise RewardFunctionError(f"reward function '{self.name}' returned {len(values)} rewards for {n} responses")
        out = []
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
                raise RewardFunctionError(
                    f"reward function '{self.name}' returned {v!r} ({type(v).__name__}) at index {i}; expected a number"
                )
            f = float(v)
            if not math.isfinite(f):
                raise RewardFunctionError(f"reward function '{self.name}' returned non-finite {f} at index {i}")
            out.append(f)
        return out

    def __call__(self, groups: list[tuple[list, list]], *, step: int) -> RewardResult:
        """Score `groups`, a list of (responses, problems) pairs; results are flattened in order."""
        futures = [self._pool.submit(_run_with_timeout, self.fn, g, self.timeout_s) for g in groups]
        rewards: list[float] = []
        valid: list[bool] = []
        failures = timeouts = 0
        for (responses, _), fut in zip(groups, futures):
            status, value = fut.result()
            n = len(responses)
            if status == "ok":
                rewards += self._check(value, n)
                valid += [True] * n
                continue
            if status == "timeout":
                timeouts += 1
                kind = "timeout"
                detail = f"a call exceeded reward.timeout_s={self.timeout_s}"
            else:
                failures += 1
                kind = type(value).__name__
                detail = f"{kind}: {value}"
            if kind not in self._seen_kinds:  # log each kind once (with its traceback), not once per call
                self._seen_kinds.add(kind)
                log.warning("reward function '%s' failed at step %d (%s); its samples are masked. "
                            "Further failures of this kind are counted, not logged.", self.name, step, detail,
                            exc_info=value if status == "error" else None)
            rewards += [0.0] * n
            valid += [False] * n
        bad = failures + timeouts
        if groups and bad / len(groups) > self.max_failure_frac:
            raise RewardFunctionError(
                f"{bad} of {len(groups)} reward calls failed at step {step}, above reward.max_failure_frac="
                f"{self.max_failure_frac}; the reward function '{self.name}' is broken"
            )
        return RewardResult(rewards, valid, failures, timeouts)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
