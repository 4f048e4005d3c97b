"""`rg:<name>`: any reasoning-gym dataset as a task (train entries from the task seed, held-out from another stream)."""

from __future__ import annotations

import difflib
from typing import Any

from credo.errors import ConfigError
from credo.tasks.problem import Problem
from credo.tasks.skill_tags import rg_skills


def check_rg_name(name: str) -> None:
    """`name` is a reasoning-gym dataset (the registry is read; nothing is built), else a ConfigError with a guess."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"config key 'task.name' = 'rg:{name}' needs reasoning-gym: "
                          "pip install 'credo[envs]'") from None
    datasets = reasoning_gym.factory.DATASETS
    if name not in datasets:
        close = difflib.get_close_matches(name, list(datasets), n=1, cutoff=0.6)
        hint = f"; did you mean 'rg:{close[0]}'?" if close else ""
        raise ConfigError(f"config key 'task.name' = 'rg:{name}' is not a reasoning-gym dataset{hint} "
                          "(`credo list` prints them all)")


_CHECKED_NOW = 64  # entries of each split validated when the task is built


class ReasoningGymTask:
    """A reasoning-gym dataset: train entries from `seed`, held-out entries from a separate seed stream. Each problem's
    `meta['skills']` maps the generator's metadata to credo's skill tags (`credo.tasks.skill_tags.rg_skills`)."""

    def __init__(self, name: str, train_size: int, eval_size: int, seed: int, **kwargs: Any):
        check_rg_name(name)
        import reasoning_gym

        try:
            self._train = reasoning_gym.create_dataset(name, size=train_size, seed=seed, **kwargs)
            self._eval = reasoning_gym.create_dataset(name, size=eval_size, seed=seed + 1_000_003, **kwargs)
        except (TypeError, AssertionError) as e:
            raise ConfigError(f"task.kwargs for 'rg:{name}' rejected by reasoning-gym: {e}") from None
        self.name = name
        if len(self._train) == 0:
            raise ConfigError(f"task 'rg:{name}' has an empty train split: expected task.train_size >= 1 entries")
        # The first entries of each split are checked now, so a malformed dataset fails before any long work; every
        # other entry is checked when it is read. Generating a whole split can take minutes (countdown: ~12 ms an
        # entry), so `credo check` must not do it.
        for i in range(min(len(self._train), _CHECKED_NOW)):
            self._problem(self._train[i], f"train entry {i}")
        for i in range(min(len(self._eval), _CHECKED_NOW)):
            self._problem(self._eval[i], f"eval entry {i}")
        self._eval_rows: list[dict] | None = None

    def _problem(self, entry, where: str) -> Problem:
        if not isinstance(entry, dict):
            raise ConfigError(f"task 'rg:{self.name}' {where} is a {type(entry).__name__}, expected a dict with "
                              "'question' and 'answer'")
        for k in ("question", "answer"):
            if k not in entry:
                raise ConfigError(f"task 'rg:{self.name}' {where} is missing the field '{k}' (expected 'question' and "
                                  f"'answer'; it has {sorted(entry)})")
        return Problem(prompt=entry["question"] + "\nAnswer: ", answer=str(entry["answer"]),
                       meta={"entry": entry, "skills": rg_skills(self.name, entry)})

    def __len__(self) -> int:
        return len(self._train)

    def train(self, i: int) -> Problem:
        return self._problem(self._train[i % len(self._train)], f"train entry {i % len(self._train)}")

    def eval_problems(self) -> list[Problem]:
        """The held-out problems whose question is not in the train split. The split is found on the first call (it
        reads the whole train split), which a run makes before its warm-up when it checks the prompts against the
        model's context."""
        if self._eval_rows is None:
            train_q = {self.train(i).prompt for i in range(len(self._train))}
            rows = [self._eval[i] for i in range(len(self._eval))
                    if self._problem(self._eval[i], f"eval entry {i}").prompt not in train_q]
            if not rows:
                raise ConfigError(f"task 'rg:{self.name}' has an empty eval split: all {len(self._eval)} held-out "
                                  "entries also occur in the train split; raise task.eval_size or use a dataset with "
                                  "more distinct questions")
            self._eval_rows = rows
        return [self._problem(e, f"eval entry {i}") for i, e in enumerate(self._eval_rows)]

    def score(self, response: str, problem: Problem) -> float:
        return float(self._train.score_answer(answer=response.strip(), entry=problem.meta["entry"]))
