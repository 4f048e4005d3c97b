"""The task registry (a leaf module): `register_task(name)` adds a task factory, `TASKS` holds them.

A factory is called as `factory(train_size, eval_size, seed, **task.kwargs)` and returns an object with
`__len__`, `train(i) -> Problem`, `eval_problems() -> list[Problem]` and, for a verifiable task,
`score(response, problem) -> float`. The built-in tasks register themselves on import of `credo.tasks`; a
family's tasks are named in its table (`credo.family.Family.tasks`) and imported on first use.
"""

from __future__ import annotations

from typing import Any, Callable

TASKS: dict[str, Callable[..., Any]] = {}
"""task name -> factory(train_size, eval_size, seed, **kwargs)."""


def register_task(name: str):
    """Decorator: register `factory` as the task `name` (task.name in a recipe)."""

    def deco(factory: Callable) -> Callable:
        if name in TASKS and TASKS[name] is not factory:
            raise ValueError(f"task '{name}' is already registered")
        TASKS[name] = factory
        return factory

    return deco
