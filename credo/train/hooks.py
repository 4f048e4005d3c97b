"""Step hooks: what a family runs around every train step, without an edit of the trainer.

    class StepHook(Protocol):
        name: str                                   # its trainer-state key and its timing metric perf/<name>_s
        def before_step(self, step: int) -> None    # before the rollout (MIPU: snapshot the trainer state)
        def after_sync(self, step, batch) -> dict   # after the update and the weight sync: the step's metrics
                                                    # (MIPU: validate the candidate, accept it or roll back)

A hook with `state_dict` / `load_state_dict` joins the trainer state: checkpointed, resumed, and restored by a
rollback. Families return their hooks from the `hooks(ctx, parts)` part of their build module (`credo.family`).
Asynchronous rollout does not use this seam: a schedule (credo/schedules/) wraps the rollout source instead.
"""

from __future__ import annotations

import time
from typing import Protocol


class StepHook(Protocol):
    name: str

    def before_step(self, step: int) -> None: ...

    def after_sync(self, step: int, batch) -> dict[str, float]: ...


def before_step(hooks: list, step: int, times: dict[str, float]) -> None:
    """Run every hook's before_step, adding the seconds each took to `times[name]`."""
    for h in hooks:
        t = time.perf_counter()
        h.before_step(step)
        times[h.name] = times.get(h.name, 0.0) + time.perf_counter() - t


def after_sync(hooks: list, step: int, batch, times: dict[str, float]) -> dict[str, float]:
    """Run every hook's after_sync; their metrics, merged, and the seconds each took added to `times[name]`."""
    out: dict[str, float] = {}
    for h in hooks:
        t = time.perf_counter()
        out.update(h.after_sync(step, batch))
        times[h.name] = times.get(h.name, 0.0) + time.perf_counter() - t
    return out
