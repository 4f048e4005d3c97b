"""Skill tasks for the reproduction testbed: the policy must compute, not fix a format.

Each task writes a worked answer of 16-64 tokens (with the char tokenizer, one token per character), so
credit assignment and loss aggregation act over long responses, and its verifier checks only the final
result: the model may write any scratchpad it likes, but only a right result earns the reward.

- `add_scratch`: `347+586=` -> `7+6+0=13,4+8+1=13,3+5+1=09>0933`: one `a+b+carry=cs` column per digit, least
  significant first, then `>` and the zero-padded sum. Reward: the integer after the last `>` equals a+b.
- `mul_scratch`: `347*6=` -> `7*6+0=42,4*6+4=28,3*6+2=20>2082`: an n-digit by 1-digit product, one
  `a*b+carry=cd` column per digit. Reward: the integer after the last `>` equals a*b.
- `sub_scratch`: `734-286=` -> `4-6-0=18,3-8-1=14,7-2-1=04>448`: an n-digit minus n-digit difference (the first
  operand at least the second), one `a-b-borrow=Bd` column per digit, least significant first, where `B` is the
  borrow out and `d` the column's digit (`d - 10B = a - b - borrow`, as `add_scratch` writes carry and digit).
  Reward: the integer after the last `>` equals a-b.
- `sort`: `sort:qwhdmxaqbn=` -> `abdhmnqqwx`: the letters in alphabetical order (repeats allowed). Reward: the
  response equals the sorted string exactly.

Every problem's `meta['skills']` says what its worked answer exercises (`credo.tasks.skill_tags`).

The problem space is shuffled once with the task seed; the first `eval_size` problems are the held-out split
and never appear in training (sort draws its strings from the seed, and drops any drawn for eval).
"""

from __future__ import annotations

import random
import string

from credo.errors import ConfigError
from credo.tasks.problem import Problem, SplitSpaceTask
from credo.tasks.registry import register_task
from credo.tasks.skill_tags import column_add_skills, column_mul_skills, column_sub_skills, sort_skills


def _final_int(response: str) -> int | None:
    """The integer after the last '>' of a response, or None when there is none."""
    tail = response.strip().rpartition(">")[2] if ">" in response else None
    if not tail or not tail.isdigit():
        return None
    return int(tail)


def worked_sum(a: int, b: int, n: int) -> str:
    """The column-by-column worked sum of two n-digit numbers (the add_scratch format), e.g. `...>0633`."""
    da, db = f"{a:0{n}d}"[::-1], f"{b:0{n}d}"[::-1]
    cols, carry = [], 0
    for x, y in zip(da, db):
        s = int(x) + int(y) + carry
        cols.append(f"{x}+{y}+{carry}={s:02d}")
        carry = s // 10
    return ",".join(cols) + f">{a + b:0{n + 1}d}"


class _ScratchTask(SplitSpaceTask):
    """The two column-arithmetic tasks: subclasses define the space and the worked answer."""

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the integer after the last '>' equals the reference result, else 0.0."""
        got = _final_int(response)
        return 1.0 if got is not None and got == problem.meta["result"] else 0.0


@register_task("add_scratch")
class AddScratchTask(_ScratchTask):
    """n-digit + n-digit addition with a column-by-column scratchpad of carries (see the module docstring)."""

    def __init__(self, train_size: int, eval_size: int, seed: int, digits: int = 3):
        if not 1 <= digits <= 6:
            raise ConfigError(f"task.kwargs.digits = {digits}: expected 1..6")
        self.digits = digits
        hi = 10 ** digits
        rng = random.Random(seed + 7)
        if hi * hi <= 100_000:
            space = [(a, b) for a in range(hi) for b in range(hi)]
        else:  # too many pairs to enumerate: draw distinct ones
            space = list({(rng.randrange(hi), rng.randrange(hi)) for _ in range(train_size + eval_size + 1000)})
            space.sort()
        super().__init__(space, train_size, eval_size, seed)

    def _problem(self, a: int, b: int) -> Problem:
        n = self.digits
        return Problem(prompt=f"{a:0{n}d}+{b:0{n}d}=", answer=worked_sum(a, b, n),
                       meta={"result": a + b, "skills": column_add_skills(a, b, n)})


@register_task("mul_scratch")
class MulScratchTask(_ScratchTask):
    """n-digit by 1-digit multiplication with a column-by-column scratchpad of carries."""

    def __init__(self, train_size: int, eval_size: int, seed: int, digits: int = 3):
        if not 1 <= digits <= 6:
            raise ConfigError(f"task.kwargs.digits = {digits}: expected 1..6")
        self.digits = digits
        space = [(a, b) for a in range(10 ** digits) for b in range(2, 10)]  # x0 and x1 teach nothing
        super().__init__(space, train_size, eval_size, seed)

    def _problem(self, a: int, b: int) -> Problem:
        n = self.digits
        cols, carry = [], 0
        for x in f"{a:0{n}d}"[::-1]:
            s = int(x) * b + carry
            cols.append(f"{x}*{b}+{carry}={s:02d}")
            carry = s // 10
        answer = ",".join(cols) + f">{a * b:0{n + 1}d}"
        return Problem(prompt=f"{a:0{n}d}*{b}=", answer=answer,
                       meta={"result": a * b, "skills": column_mul_skills(a, b, n)})


def worked_difference(a: int, b: int, n: int) -> str:
    """The column-by-column worked difference a - b (a >= b) of two n-digit numbers (the sub_scratch format)."""
    da, db = f"{a:0{n}d}"[::-1], f"{b:0{n}d}"[::-1]
    cols, borrow = [], 0
    for x, y in zip(da, db):
        d = int(x) - int(y) - borrow
        out = int(d < 0)
        cols.append(f"{x}-{y}-{borrow}={out}{d + 10 * out}")
        borrow = out
    return ",".join(cols) + f">{a - b:0{n}d}"


@register_task("sub_scratch")
class SubScratchTask(_ScratchTask):
    """n-digit minus n-digit subtraction (first operand >= second) with a column-by-column scratchpad of borrows."""

    def __init__(self, train_size: int, eval_size: int, seed: int, digits: int = 2):
        if not 2 <= digits <= 4:  # 1 digit: 55 problems and 9-token answers
            raise ConfigError(f"task.kwargs.digits = {digits}: expected 2..4")
        self.digits = digits
        hi = 10 ** digits
        space = [(a, b) for a in range(hi) for b in range(a + 1)]
        super().__init__(space, train_size, eval_size, seed)

    def _problem(self, a: int, b: int) -> Problem:
        n = self.digits
        return Problem(prompt=f"{a:0{n}d}-{b:0{n}d}=", answer=worked_difference(a, b, n),
                       meta={"result": a - b, "skills": column_sub_skills(a, b)})


@register_task("sort")
class SortTask:
    """Sort `length` random lowercase letters (repeats allowed); reward 1 for the exactly sorted string."""

    def __init__(self, train_size: int, eval_size: int, seed: int, length: int = 16, alphabet: int = 26):
        if not 2 <= length <= 64:
            raise ConfigError(f"task.kwargs.length = {length}: expected 2..64")
        if not 2 <= alphabet <= 26:
            raise ConfigError(f"task.kwargs.alphabet = {alphabet}: expected 2..26")
        letters = string.ascii_lowercase[:alphabet]
        rng = random.Random(seed)
        draw = lambda: "".join(rng.choice(letters) for _ in range(length))  # noqa: E731
        self._eval = [draw() for _ in range(eval_size)]
        held = set(self._eval)
        self._train = []
        while len(self._train) < train_size:
            s = draw()
            if s not in held:
                self._train.append(s)

    def __len__(self) -> int:
        return len(self._train)

    @staticmethod
    def _problem(s: str) -> Problem:
        return Problem(prompt=f"sort:{s}=", answer="".join(sorted(s)), meta={"skills": sort_skills(s)})

    def train(self, i: int) -> Problem:
        return self._problem(self._train[i % len(self._train)])

    def eval_problems(self) -> list[Problem]:
        return [self._problem(s) for s in self._eval]

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the response is exactly the sorted string, else 0.0."""
        return 1.0 if response.strip() == problem.answer else 0.0
