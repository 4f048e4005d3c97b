"""`Problem`, the record every task hands out, and `SplitSpaceTask`, a finite space split into train and held-out.

`Problem` is part of the reward-function contract (`fn(responses, problems) -> rewards`); it is also importable
as `credo.rewards.tasks.Problem`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from credo.errors import ConfigError


@dataclass
class Problem:
    prompt: str | list
    """Text the policy continues, or a list of chat messages (rendered with the tokenizer's chat template)."""
    answer: str
    """Reference answer (what SFT warm-up teaches, and what the verifier checks against)."""
    meta: dict = field(default_factory=dict)
    """Task-specific data the verifier may need; a file task's other columns under 'columns'."""


class SplitSpaceTask:
    """A finite problem space shuffled once with the task seed: the first `eval_size` problems are the
    held-out split and never appear in training; the next `train_size` are the training problems.
    Subclasses build the space (tuples) and `_problem(*item) -> Problem`."""

    def __init__(self, space: list[tuple], train_size: int, eval_size: int, seed: int):
        if eval_size >= len(space):
            raise ConfigError(f"task.eval_size = {eval_size} leaves no training problems (the task has {len(space)})")
        random.Random(seed).shuffle(space)
        self._eval = space[:eval_size]
        self._train = space[eval_size:][:train_size]

    def _problem(self, *item) -> Problem:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._train)

    def train(self, i: int) -> Problem:
        return self._problem(*self._train[i % len(self._train)])

    def eval_problems(self) -> list[Problem]:
        return [self._problem(*t) for t in self._eval]
