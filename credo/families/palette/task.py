"""`add_two_ways`: n-digit addition demonstrated in two scratchpad strategies, for Reasoning Palette's steering demo.

    columns     47+86= -> 7+6+0=13,4+8+1=13>133   ones first, one `a+b+carry=cs` column per digit (add_scratch's)
    tens_first  47+86= -> 4+8=12,7+6=13>133       the most significant digits first, no carries written: the
                                                  carry into the result is done in the head

Each training problem's demonstration uses one of the two, fixed per problem by a hash of the operands (a share
`tens_first_frac` of them tens-first), so a warm-up on these demonstrations leaves a policy that picks a strategy
at random; the verifier checks only the integer after the last `>`, so both earn the reward when right.
`strategy(response)` names the strategy a response follows ('columns', 'tens_first' or 'other'), for the
within-group strategy entropy the palette family logs.
"""

from __future__ import annotations

import hashlib
import re

from credo.errors import ConfigError
from credo.tasks.problem import Problem, SplitSpaceTask
from credo.tasks.skills import worked_sum

STRATEGIES = ("columns", "tens_first")
_COLUMN = re.compile(r"^\d\+\d\+\d=\d\d(,\d\+\d\+\d=\d\d)*>\d+$")
_TENS_FIRST = re.compile(r"^\d\+\d=\d\d(,\d\+\d=\d\d)*>\d+$")


columns_answer = worked_sum  # the add_scratch format: right-to-left columns with their carries


def tens_first_answer(a: int, b: int, n: int) -> str:
    da, db = f"{a:0{n}d}", f"{b:0{n}d}"
    return ",".join(f"{x}+{y}={int(x) + int(y):02d}" for x, y in zip(da, db)) + f">{a + b:0{n + 1}d}"


def strategy(response: str) -> str:
    """'columns', 'tens_first' or 'other': the scratchpad form of a response (right or wrong)."""
    text = response.strip()
    if _COLUMN.match(text):
        return "columns"
    if _TENS_FIRST.match(text):
        return "tens_first"
    return "other"


class AddTwoWaysTask(SplitSpaceTask):
    """n-digit + n-digit addition, each training demonstration in one of two strategies (module docstring)."""

    def __init__(self, train_size: int, eval_size: int, seed: int, digits: int = 2, tens_first_frac: float = 0.5):
        if not 1 <= digits <= 4:
            raise ConfigError(f"task.kwargs.digits = {digits}: expected 1..4")
        if not 0 <= tens_first_frac <= 1:
            raise ConfigError(f"task.kwargs.tens_first_frac = {tens_first_frac}: expected in [0, 1]")
        self.digits, self.tens_first_frac = digits, tens_first_frac
        hi = 10 ** digits
        super().__init__([(a, b) for a in range(hi) for b in range(hi)], train_size, eval_size, seed)

    def _strategy_of(self, a: int, b: int) -> str:
        u = int.from_bytes(hashlib.sha256(f"{a}+{b}".encode()).digest()[:4], "little") / 2**32
        return "tens_first" if u < self.tens_first_frac else "columns"

    def _problem(self, a: int, b: int) -> Problem:
        n, how = self.digits, self._strategy_of(a, b)
        answer = columns_answer(a, b, n) if how == "columns" else tens_first_answer(a, b, n)
        return Problem(prompt=f"{a:0{n}d}+{b:0{n}d}=", answer=answer, meta={"result": a + b, "strategy": how})

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the integer after the last '>' equals a + b, else 0.0."""
        text = response.strip()
        tail = text.rpartition(">")[2] if ">" in text else ""
        return 1.0 if tail.isdigit() and int(tail) == problem.meta["result"] else 0.0

    strategy = staticmethod(strategy)
    strategies = STRATEGIES + ("other",)
    """The labels `strategy` returns."""


def add_two_ways(train_size: int, eval_size: int, seed: int, **kwargs) -> AddTwoWaysTask:
    """The task factory the family table names (`task.name: add_two_ways`)."""
    return AddTwoWaysTask(train_size, eval_size, seed, **kwargs)
