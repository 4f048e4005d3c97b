"""Reward calls isolated from the run: a per-call timeout, failures masked and counted, never fatal alone.

A reward function is called once per group (the responses to one prompt) as
`fn(responses: list[str], problems: list[Problem]) -> list[float]`, so an LLM judge that compares a
group's responses drops in as is. A group call that raises is retried sample by sample (a list of one
in, a list of one out: TRL's contract), so one bad sample does not void its group: only the samples
whose own call raises are invalid. A call that times out is not retried and marks its samples invalid.
The trainer masks invalid samples from the loss and counts them in `train/reward_failures` (samples, not
calls); more than `max_failure_frac` of a step's samples failing stops the run. Returning the wrong length
or a non-number is a bug in the reward function, not a transient failure, and stops the run with an
error naming the function.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from credo.errors import ConfigError, RewardFunctionError

log = logging.getLogger("credo.rewards")

GroupRewardFn = Callable[[list, list], Sequence[float]]


@dataclass
class RewardResult:
    rewards: list[float]
    """One reward per sample; 0.0 where the call failed."""
    valid: list[bool]
    """False for samples whose reward call raised or timed out."""
    failures: int
    """Samples whose reward call raised (after the per-sample retry)."""
    timeouts: int
    """Samples whose reward call timed out."""
    parts: dict[str, list[float]] | None = None
    """Per reward function (`reward.functions`), one value per sample; NaN where it returned None or the call failed."""


def per_sample(score: Callable) -> GroupRewardFn:
    """Lift a verifier `score(response, problem) -> float` to the group interface."""

    def group_fn(responses: list, problems: list) -> list[float]:
        return [score(r, p) for r, p in zip(responses, problems)]

    group_fn.__name__ = getattr(score, "__name__", "score")
    return group_fn


def import_reward_fn(spec: str, key: str = "reward.function") -> GroupRewardFn:
    """Import `package.module:function` (the recipe's `reward.function`, or the entry `key` of reward.functions)."""
    if ":" not in spec:
        raise ConfigError(f"{key} = '{spec}': expected 'module:function'")
    mod, name = spec.split(":", 1)
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to the recipe's working directory import
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key} = '{spec}' cannot be imported: {e}") from None
    if not callable(fn):
        raise ConfigError(f"{key} = '{spec}' is not callable")
    return fn


def check_rewards(value, n: int, name: str, *, allow_none: bool = False) -> list[float]:
    """`value` as n finite floats; None becomes NaN where `allow_none` (TRL's "does not apply to this sample").

    Raises:
        RewardFunctionError: not a sequence, the wrong length, or an entry that is not a finite number.
    """
    try:
        values = list(value)
    except TypeError:
        raise RewardFunctionError(
            f"reward function '{name}' returned {type(value).__name__}; expected a list of {n} numbers") from None
    if len(values) != n:
        raise RewardFunctionError(f"reward function '{name}' returned {len(values)} rewards for {n} responses")
    out = []
    for i, v in enumerate(values):
        if v is None and allow_none:
            out.append(math.nan)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise RewardFunctionError(
                f"reward function '{name}' returned {v!r} ({type(v).__name__}) at index {i}; expected a number")
        f = float(v)
        if not math.isfinite(f):
            raise RewardFunctionError(f"reward function '{name}' returned non-finite {f} at index {i}")
        out.append(f)
    return out


class ScoredGroup:
    """What a `WeightedRewards` call returns: each function's raw values, checked and summed by `finish`
    on the caller's thread (a broken contract stops the run; it is not a transient failure)."""

    def __init__(self, raw: dict[str, object], weights: dict[str, float]):
        self.raw, self.weights = raw, weights
        self.parts: dict[str, list[float]] = {}

    def finish(self, n: int) -> list[float]:
        """The weighted sum per sample, NaN parts skipped (TRL's nansum); fills `parts`."""
        self.parts = {name: check_rewards(v, n, name, allow_none=True) for name, v in self.raw.items()}
        return [sum(self.weights[k] * vals[i] for k, vals in self.parts.items() if not math.isnan(vals[i]))
                for i in range(n)]


def _check(value, n: int, name: str) -> list[float]:
    if isinstance(value, ScoredGroup):
        return value.finish(n)
    return check_rewards(value, n, name)


def _log_first(status: str, value, *, step: int, name: str, timeout_s: float, seen_kinds: set[str]) -> None:
    """Log the first failure of each kind (with its traceback); later ones are only counted."""
    kind = "timeout" if status == "timeout" else type(value).__name__
    if kind in seen_kinds:
        return
    seen_kinds.add(kind)
    detail = f"a call exceeded reward.timeout_s={timeout_s}" if status == "timeout" else f"{kind}: {value}"
    log.warning("reward function '%s' failed at step %d (%s); its samples are masked (a group that raises is "
                "retried sample by sample). Further failures of this kind are counted, not logged.", name,
                step, detail, exc_info=value if status == "error" else None)


def _per_sample(status: str, value, n: int, name: str) -> list[tuple[str, object]]:
    """A call's outcome as one (status, (reward, parts) or None) per sample."""
    if status != "ok":
        return [(status, None)] * n
    rewards = _check(value, n, name)
    parts = getattr(value, "parts", {})
    return [("ok", (rewards[i], {k: v[i] for k, v in parts.items()})) for i in range(n)]


def tally(groups: list[tuple], run: Callable[[list[tuple]], list[tuple[str, object]]], *, step: int, name: str,
          timeout_s: float, max_failure_frac: float, names: tuple = (), seen_kinds: set[str]) -> RewardResult:
    """The `RewardResult` of `groups`, shared by every reward worker. `run(calls)` runs the function once per call's
    arguments and returns each outcome in order: ('ok', value) | ('error', exc) | ('timeout', None). A group whose
    call raised is run again sample by sample (one more `run` for all such samples); failed samples are masked and
    counted, the first failure of each kind logged (`seen_kinds` remembers them), a broken contract or more than
    `max_failure_frac` failed samples raised (RewardFunctionError)."""
    outcomes = run(groups)
    singles: list[tuple] = []
    for group, (status, value) in zip(groups, outcomes):
        if status != "ok":
            _log_first(status, value, step=step, name=name, timeout_s=timeout_s, seen_kinds=seen_kinds)
            if status == "error" and len(group[0]) > 1:
                singles += [tuple(a[i:i + 1] if a is not None else None for a in group) for i in range(len(group[0]))]
    single_outcomes = iter(run(singles) if singles else [])
    per_sample: list[tuple[str, object]] = []
    for group, (status, value) in zip(groups, outcomes):
        n = len(group[0])
        if status == "error" and n > 1:
            for _ in range(n):
                per_sample += _per_sample(*next(single_outcomes), 1, name)
        else:
            per_sample += _per_sample(status, value, n, name)
    return _result(per_sample, names, step=step, name=name, max_failure_frac=max_failure_frac)


def _result(per_sample: list[tuple[str, object]], names: tuple, *, step: int, name: str,
            max_failure_frac: float) -> RewardResult:
    parts: dict[str, list[float]] = {part: [] for part in names}
    for status, value in per_sample:
        for part, values in parts.items():
            values.append(value[1][part] if status == "ok" else math.nan)
    failures = sum(status == "error" for status, _ in per_sample)
    timeouts = sum(status == "timeout" for status, _ in per_sample)
    bad = failures + timeouts
    if per_sample and bad / len(per_sample) > max_failure_frac:
        raise RewardFunctionError(
            f"{bad} of {len(per_sample)} samples failed their reward call at step {step}, above "
            f"reward.max_failure_frac={max_failure_frac}; the reward function '{name}' is broken"
        )
    rewards = [value[0] if status == "ok" else 0.0 for status, value in per_sample]
    valid = [status == "ok" for status, _ in per_sample]
    return RewardResult(rewards, valid, failures, timeouts, parts or None)


def note_failure(status: str, value, *, name: str, timeout_s: float, seen_kinds: set[str]) -> None:
    """Log the first failed `run_one` outcome of each kind (later ones are counted by the caller, not logged)."""
    kind = "timeout" if status == "timeout" else type(value).__name__
    if status != "ok" and kind not in seen_kinds:
        seen_kinds.add(kind)
        log.warning("'%s' failed (%s); its samples are masked. Further failures of this kind are counted, "
                    "not logged.", name, f"a call exceeded reward.timeout_s={timeout_s}"
                    if status == "timeout" else f"{kind}: {value}", exc_info=value if status == "error" else None)


_worker_ids = itertools.count()


class _Call:
    """One reward call: its arguments, when a worker started it, and its outcome."""

    __slots__ = ("args", "started_at", "done", "status", "value", "abandoned")

    def __init__(self, args: tuple):
        self.args = args
        self.started_at: float | None = None
        self.done = threading.Event()
        self.status, self.value = "error", None
        self.abandoned = False


class RewardWorker:
    """Evaluates groups of responses with a per-call timeout and failure accounting.

    `workers` daemon threads take calls from a queue. A call past its timeout is abandoned (a thread
    cannot be killed): its thread exits once the call returns, and a fresh thread takes its place at
    once, so a hung judge costs a thread, not capacity. Threads are long-lived because starting one
    per call cost more than a cheap verifier's whole step.
    """

    def __init__(self, fn: GroupRewardFn, *, timeout_s: float, workers: int, max_failure_frac: float):
        self.fn = fn
        self.timeout_s = timeout_s
        self.max_failure_frac = max_failure_frac
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.thread_name = f"credo-reward-{next(_worker_ids)}"
        self._workers = workers
        self._seen_kinds: set[str] = set()
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, daemon=True, name=self.thread_name).start()

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            call.started_at = time.monotonic()
            try:
                status, value = "ok", self.fn(*call.args)
            except BaseException as e:  # noqa: BLE001 - any failure of user code is isolated
                status, value = "error", e
            with self._lock:  # against _wait deciding on a timeout at this very moment
                if call.abandoned:  # replaced when it timed out; leave so the pool keeps its size
                    return
                call.status, call.value = status, value
                call.done.set()

    def _wait(self, call: _Call) -> tuple[str, object]:
        """('ok', value) | ('error', exception) | ('timeout', None) once `call` is done or has run timeout_s."""
        while True:
            started = call.started_at
            wait = 0.05 if started is None else started + self.timeout_s - time.monotonic()
            if not call.done.wait(max(wait, 0.0)) and started is not None:
                with self._lock:
                    if not call.done.is_set() and time.monotonic() - started >= self.timeout_s:
                        call.abandoned = True
                        self._spawn()
                        return "timeout", None
            if call.done.is_set():
                return call.status, call.value

    def _submit(self, args: tuple) -> _Call:
        call = _Call(args)
        self._queue.put(call)
        return call

    def _run(self, calls: list[tuple]) -> list[tuple[str, object]]:
        """Each call's outcome, in order; all are queued before the first is awaited."""
        return [self._wait(call) for call in [self._submit(args) for args in calls]]

    def __call__(self, groups: list[tuple], *, step: int) -> RewardResult:
        """Score `groups`, a list of (responses, problems) pairs (or (responses, problems, completion_ids) for a
        `WeightedRewards`); results are flattened in order."""
        return tally(groups, self._run, step=step, name=self.name, timeout_s=self.timeout_s,
                     max_failure_frac=self.max_failure_frac, names=getattr(self.fn, "names", ()),
                     seen_kinds=self._seen_kinds)

    def run_one(self, *args) -> tuple[str, object]:
        """Run `fn(*args)` once under the timeout, without the reward-list checks (a batched judge's generate call).

        Returns:
            ('ok', value), ('error', exception) or ('timeout', None); the first failure of each kind is logged.
        """
        status, value = self._wait(self._submit(args))
        note_failure(status, value, name=self.name, timeout_s=self.timeout_s, seen_kinds=self._seen_kinds)
        return status, value

    def close(self) -> None:
        """Let the worker threads exit once idle (calls still queued run first); safe to call twice."""
        workers, self._workers = self._workers, 0
        for _ in range(workers):
            self._queue.put(None)
