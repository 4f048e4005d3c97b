"""A long-tail workload: scratchpad addition whose number of digits is drawn from a log-normal.

Response lengths in RL post-training are long-tailed (RollPacker, arXiv 2509.21009: a few long responses hold
the whole step). This task makes that shape on purpose, so tail batching, packing and `credo simulate` have a
workload to measure. Each problem draws its digit count n from a log-normal (median `median_digits`, log-space
standard deviation `sigma`, clipped to 1..`max_digits`) and writes the worked answer of the testbed's
`add_scratch` task (credo.tasks.skills): one `a+b+carry=cs` column per digit, least significant first, then
`>` and the zero-padded sum:

    `047+586=` -> `7+6+0=13,4+8+1=13,0+5+1=06>0633`

The answer has 10n + 1 characters (one token each with the char tokenizer) plus EOS: 12 tokens at n = 1 and
252 at n = 25, so the response length is a discretised, clipped log-normal from about 8 to 256 tokens (the
defaults, over 20,000 drawn problems: median 32 tokens, 90% quantile 82, 95% 112, 99% 192, max
252). The verifier checks only the integer after the last `>`: any scratchpad earns the reward if the result is
right.

Train and held-out problems are drawn from one seeded stream; a drawn problem whose prompt is in the held-out
split never enters training.
"""

from __future__ import annotations

import math
import random

from credo.errors import ConfigError
from credo.tasks.problem import Problem
from credo.tasks.registry import register_task
from credo.tasks.skill_tags import column_add_skills
from credo.tasks.skills import _final_int, worked_sum


def draw_digits(rng: random.Random, median_digits: float, sigma: float, max_digits: int) -> int:
    """One digit count: round(exp(N(log median_digits, sigma))) clipped to 1..max_digits."""
    return min(max_digits, max(1, round(math.exp(rng.gauss(math.log(median_digits), sigma)))))


@register_task("longtail_add")
class LongTailAddTask:
    """n-digit + n-digit scratchpad addition with n ~ log-normal (see the module docstring)."""

    def __init__(self, train_size: int, eval_size: int, seed: int, median_digits: float = 3.0,
                 sigma: float = 0.8, max_digits: int = 25):
        if not 1 <= median_digits <= max_digits:
            raise ConfigError(f"task.kwargs.median_digits = {median_digits}: expected 1..max_digits ({max_digits})")
        if not 0 <= sigma <= 3:
            raise ConfigError(f"task.kwargs.sigma = {sigma}: expected 0..3 (log-space standard deviation)")
        if not 1 <= max_digits <= 60:
            raise ConfigError(f"task.kwargs.max_digits = {max_digits}: expected 1..60")
        rng = random.Random(seed + 11)

        def draw() -> tuple[int, int, int]:
            n = draw_digits(rng, median_digits, sigma, max_digits)
            return rng.randrange(10 ** n), rng.randrange(10 ** n), n

        self._eval = [draw() for _ in range(eval_size)]
        held = set(self._eval)
        self._train: list[tuple[int, int, int]] = []
        while len(self._train) < train_size:
            item = draw()
            if item not in held:  # a held-out problem never enters training (1-digit sums can repeat)
                self._train.append(item)

    def __len__(self) -> int:
        return len(self._train)

    @staticmethod
    def _problem(a: int, b: int, n: int) -> Problem:
        return Problem(prompt=f"{a:0{n}d}+{b:0{n}d}=", answer=worked_sum(a, b, n),
                       meta={"result": a + b, "digits": n, "skills": column_add_skills(a, b, n)})

    def train(self, i: int) -> Problem:
        return self._problem(*self._train[i % len(self._train)])

    def eval_problems(self) -> list[Problem]:
        return [self._problem(*t) for t in self._eval]

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the integer after the last '>' equals a + b, else 0.0."""
        got = _final_int(response)
        return 1.0 if got is not None and got == problem.meta["result"] else 0.0
