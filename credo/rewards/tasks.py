"""Verifiable tasks: prompts, reference answers, a verifier, and disjoint train / held-out eval splits.

A task is a small object with `train(i)`, `eval_problems()` and `score(response, problem)`. Built in:
`arithmetic` (integer + and -, exact-match verifier), the testbed's skill tasks `add_scratch`, `mul_scratch` and
`sort` (credo.rewards.skills: worked answers of 16-64 tokens, the final result verified) and any reasoning-gym dataset as `rg:<name>`;
your own data as `file` / `hf:<name>` (credo.rewards.data: prompts and columns, no verifier).
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from credo.config import ConfigError, TaskConfig


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


class ArithmeticTask(SplitSpaceTask):
    """`a+b=` / `a-b=` with operands in [0, max_operand]; reward 1 for the exact integer, else 0.

    With `fixed_width`, operands are zero-padded to the width of max_operand and the answer to one more
    digit, so every digit sits at a fixed position: a tiny model learns the carries far sooner.

    The full problem space is shuffled once with the task seed: the first `eval_size` problems are the
    held-out split and never appear in training.
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, max_operand: int = 99, ops: str = "+",
                 fixed_width: bool = False):
        if not ops or any(o not in "+-" for o in ops):
            raise ConfigError(f"task.kwargs.ops = {ops!r}: expected a string of '+' and '-'")
        if max_operand < 1:
            raise ConfigError(f"task.kwargs.max_operand = {max_operand}: expected >= 1")
        space = [(a, b, o) for o in ops for a in range(max_operand + 1) for b in range(max_operand + 1)]
        super().__init__(space, train_size, eval_size, seed)
        self.width = len(str(max_operand)) if fixed_width else 0

    def _problem(self, a: int, b: int, o: str) -> Problem:
        w = self.width  # fixed width zero-pads operands and the answer ("07+45=052"): digits keep their positions
        value = a + b if o == "+" else a - b
        answer = f"{'-' if value < 0 else ''}{abs(value):0{w + 1 if w else 0}d}"
        return Problem(prompt=f"{a:0{w}d}{o}{b:0{w}d}=" if w else f"{a}{o}{b}=", answer=answer)

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the response is exactly the integer answer (leading zeros allowed), else 0.0."""
        text = response.strip()
        digits = text[1:] if text.startswith("-") else text
        if not digits.isdigit():
            return 0.0
        return 1.0 if int(text) == int(problem.answer) else 0.0


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


class ReasoningGymTask:
    """A reasoning-gym dataset: train entries from `seed`, held-out entries from a separate seed stream."""

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
        train_q = {self._problem(self._train[i], f"train entry {i}").prompt for i in range(len(self._train))}
        self._eval_rows = [self._eval[i] for i in range(len(self._eval))
                           if self._problem(self._eval[i], f"eval entry {i}").prompt not in train_q]
        if not self._eval_rows:
            raise ConfigError(f"task 'rg:{name}' has an empty eval split: all {len(self._eval)} held-out entries also occur "
                              "in the train split; raise task.eval_size or use a dataset with more distinct questions")

    def _problem(self, entry, where: str) -> Problem:
        if not isinstance(entry, dict):
            raise ConfigError(f"task 'rg:{self.name}' {where} is a {type(entry).__name__}, expected a dict with "
                              "'question' and 'answer'")
        for k in ("question", "answer"):
            if k not in entry:
                raise ConfigError(f"task 'rg:{self.name}' {where} is missing the field '{k}' (expected 'question' and "
                                  f"'answer'; it has {sorted(entry)})")
        return Problem(prompt=entry["question"] + "\nAnswer: ", answer=str(entry["answer"]), meta={"entry": entry})

    def __len__(self) -> int:
        return len(self._train)

    def train(self, i: int) -> Problem:
        return self._problem(self._train[i % len(self._train)], f"train entry {i % len(self._train)}")

    def eval_problems(self) -> list[Problem]:
        return [self._problem(e, f"eval entry {i}") for i, e in enumerate(self._eval_rows)]

    def score(self, response: str, problem: Problem) -> float:
        return float(self._train.score_answer(answer=response.strip(), entry=problem.meta["entry"]))


def _judge_arithmetic(*args, **kwargs):
    """The synthetic judging task (credo.rewards.judge_tasks; imported here lazily, it builds on ArithmeticTask)."""
    from credo.rewards.judge_tasks import ArithmeticJudgeTask

    return ArithmeticJudgeTask(*args, **kwargs)


def _ce_rm_arithmetic(*args, **kwargs):
    """CE-RM's two turns on arithmetic (credo.rewards.judge_tasks)."""
    from credo.rewards.judge_tasks import CriteriaJudgeTask

    return CriteriaJudgeTask(*args, **kwargs)


def _pgenrm_users(*args, **kwargs):
    """P-GenRM's synthetic users and evaluation chains (credo.rewards.pgenrm_task, arXiv 2602.12116)."""
    from credo.rewards.pgenrm_task import PersonalJudgeTask

    return PersonalJudgeTask(*args, **kwargs)


def _longtail_add(*args, **kwargs):
    """Scratchpad addition with log-normal digit counts: the long-tail workload (credo.tasks.longtail; lazily)."""
    from credo.tasks.longtail import LongTailAddTask

    return LongTailAddTask(*args, **kwargs)


from credo.rewards.skills import AddScratchTask, MulScratchTask, SortTask  # noqa: E402  (they import Problem)

TASKS: dict[str, Callable[..., Any]] = {"arithmetic": ArithmeticTask, "add_scratch": AddScratchTask,
                                       "mul_scratch": MulScratchTask, "sort": SortTask,
                                       "judge_arithmetic": _judge_arithmetic, "ce_rm_arithmetic": _ce_rm_arithmetic,
                                       "pgenrm_users": _pgenrm_users, "longtail_add": _longtail_add}


def make_task(cfg: TaskConfig):
    """Build the task a recipe names; `rg:<name>` selects a reasoning-gym dataset, `file` and `hf:<name>` your
    own data (`credo.rewards.data`)."""
    kwargs = dict(cfg.kwargs)
    if cfg.name == "file" or cfg.name.startswith("hf:"):
        from credo.rewards.data import make_file_task

        return make_file_task(cfg.name, cfg)
    if cfg.name.startswith("rg:"):
        return ReasoningGymTask(cfg.name[3:], cfg.train_size, cfg.eval_size, cfg.seed, **kwargs)
    if cfg.name not in TASKS:
        raise ConfigError(f"config key 'task.name' = '{cfg.name}' is not a known task (known: {', '.join(TASKS)}, rg:<dataset>, file, hf:<name>)")
    try:
        return TASKS[cfg.name](cfg.train_size, cfg.eval_size, cfg.seed, **kwargs)
    except TypeError as e:
        raise ConfigError(f"task.kwargs for '{cfg.name}': {e}") from None
