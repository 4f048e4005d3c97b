"""`arithmetic`: integer + and - with an exact-match verifier (the quickstart's task)."""

from __future__ import annotations

from credo.errors import ConfigError
from credo.tasks.problem import Problem, SplitSpaceTask
from credo.tasks.registry import register_task
from credo.tasks.skill_tags import column_add_skills, column_sub_skills


@register_task("arithmetic")
class ArithmeticTask(SplitSpaceTask):
    """`a+b=` / `a-b=` with operands in [0, max_operand]; reward 1 for the exact integer, else 0.

    With `fixed_width`, operands are zero-padded to the width of max_operand and the answer to one more
    digit, so every digit sits at a fixed position: a tiny model learns the carries far sooner.

    `meta['skills']` tags what each problem exercises (`credo.tasks.skill_tags`).

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
        skills = column_add_skills(a, b, len(str(max(a, b))), scratchpad=False) if o == "+" else column_sub_skills(a, b)
        return Problem(prompt=f"{a:0{w}d}{o}{b:0{w}d}=" if w else f"{a}{o}{b}=", answer=answer, meta={"skills": skills})

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the response is exactly the integer answer (leading zeros allowed), else 0.0."""
        text = response.strip()
        digits = text[1:] if text.startswith("-") else text
        if not digits.isdigit():
            return 0.0
        return 1.0 if int(text) == int(problem.answer) else 0.0
