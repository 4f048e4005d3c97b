"""A synthetic judging task a tiny model can learn: judge answers to the arithmetic task.

Each item takes an arithmetic problem ("07+45=") and one candidate answer (pointwise) or two
(pairwise, exactly one right), built deterministically from the item's index:

    ok       the right answer                     ("052")
    carry    the carry into the tens dropped       ("042"; +-1 when the sum has no carry)
    digit    one digit of the answer changed        ("058")
    format   the right answer with a stray '.'      ("052.", the quickstart's SFT defect)

The *human critique* names the error with a fixed phrase (CRITIQUES); the target a warm-up (SFT)
teaches is "<critique> \\boxed{10}" / "\\boxed{0}" (pointwise) or "<critique of the wrong answer>
\\boxed{A}" (pairwise); with `critique=False` the box alone. `score` is the outcome verifier
R_outcome = 1[verdict == label] (RM-NLHF, arXiv 2601.07349) used when the judge itself is trained.
A share `human_critique_frac` of items carries its human critique in `meta` (RM-NLHF's
"DataWithHumanCritique"); the rest have none (MetaRM's data).
"""

from __future__ import annotations

import random
import re

from credo.config import ConfigError
from credo.families.judges.parse import parse_pairwise_verdict, parse_pointwise_score
from credo.families.judges.prompts import (COMPACT_CRITERIA_POINTWISE, COMPACT_PAIRWISE, COMPACT_POINTWISE, check_template,
                                         pairwise_prompt, pointwise_prompt)
from credo.tasks import ArithmeticTask, Problem

CRITIQUES = {"ok": "ok", "carry": "carry lost", "digit": "bad digit", "format": "stray dot"}
ERRORS = ("carry", "digit", "format")


def wrong_answer(answer: str, kind: str, rng: random.Random, a: int, b: int) -> str:
    """The right `answer` string spoiled by an error of `kind` (its width kept, so only the value differs)."""
    value, width = int(answer), len(answer.lstrip("-"))
    if kind == "format":
        return answer + "."
    if kind == "carry":
        wrong = value - 10 if (a % 10) + (b % 10) >= 10 else value + rng.choice((-1, 1))
    else:  # digit: change one digit that keeps the answer non-negative
        digits = list(answer)
        pos = rng.randrange(len(digits))
        digits[pos] = str((int(digits[pos]) + rng.randrange(1, 10)) % 10)
        wrong = int("".join(digits))
    if wrong == value or wrong < 0:
        wrong = value + 1
    return f"{wrong:0{width}d}"


class ArithmeticJudgeTask:
    """Pointwise or pairwise judgement of arithmetic answers (see the module docstring).

    Args:
        mode: 'pointwise' (score the one answer 0 or 10) or 'pairwise' (which of A, B is right).
        template: the judge prompt (default: the compact one a tiny model fits).
        wrong_frac: pointwise share of wrong candidates.
        critique: targets start with the human critique.
        human_critique_frac: share of items whose meta carries the human critique.
        critique_noise: share of targets whose critique is another (wrong) phrase while the label stays right:
            a warm-up that teaches RM-NLHF's "guessing" (right label, wrong critique).
        solve_first: targets start with the judge's own solution ("=052 ..."), a one-turn form of CE-RM's
            query-only criteria. Measured (docs/judges.md): a tiny judge then copies the candidate's digits.
        arithmetic kwargs: max_operand, ops, fixed_width as the arithmetic task.
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, mode: str = "pointwise",
                 template: str | None = None, wrong_frac: float = 0.5, critique: bool = False,
                 human_critique_frac: float = 1.0, critique_noise: float = 0.0, solve_first: bool = False,
                 **arithmetic):
        if mode not in ("pointwise", "pairwise"):
            raise ConfigError(f"task.kwargs.mode = {mode!r}: expected 'pointwise' or 'pairwise'")
        self.mode, self.seed, self.critique = mode, seed, critique
        self.template = template or (COMPACT_POINTWISE if mode == "pointwise" else COMPACT_PAIRWISE)
        check_template(self.template, mode, "task.kwargs.template")
        for name, v in (("wrong_frac", wrong_frac), ("human_critique_frac", human_critique_frac),
                        ("critique_noise", critique_noise)):
            if not 0 <= v <= 1:
                raise ConfigError(f"task.kwargs.{name} = {v}: expected a number in [0, 1]")
        self.wrong_frac, self.human_frac, self.critique_noise = wrong_frac, human_critique_frac, critique_noise
        self.solve_first = solve_first
        self.base = ArithmeticTask(train_size, eval_size, seed, **arithmetic)
        self._eval = [self._item(p, 10**9 + i) for i, p in enumerate(self.base.eval_problems())]

    def __len__(self) -> int:
        return len(self.base)

    def train(self, i: int) -> Problem:
        return self._item(self.base.train(i), i % len(self.base))

    def eval_problems(self) -> list[Problem]:
        return self._eval

    def _item(self, p: Problem, index: int) -> Problem:
        rng = random.Random(self.seed * 1_000_003 + index)
        a, b = (int(x) for x in p.prompt.rstrip("=").replace("-", "+").split("+")[:2])
        error = rng.choice(ERRORS)
        wrong = wrong_answer(p.answer, error, rng, a, b)
        human = rng.random() < self.human_frac
        meta = {"question": p.prompt, "reference": p.answer, "error": error, "has_human_critique": human}
        if self.mode == "pointwise":
            is_wrong = rng.random() < self.wrong_frac
            cand = wrong if is_wrong else p.answer
            kind = error if is_wrong else "ok"
            score = 0 if is_wrong else 10
            meta.update(label=score, candidate=cand, critique=CRITIQUES[kind], error=kind)
            prompt = pointwise_prompt(p.prompt, cand, template=self.template)
            box = f"\\boxed{{{score}}}"
        else:
            label = rng.choice("AB")
            ra, rb = (p.answer, wrong) if label == "A" else (wrong, p.answer)
            meta.update(label=label, responses=(ra, rb), critique=CRITIQUES[error])
            prompt = pairwise_prompt(p.prompt, ra, rb, template=self.template)
            box = f"\\boxed{{{label}}}"
        said = meta["critique"]  # the warm-up target's critique: with critique_noise, a wrong phrase (a guesser)
        if rng.random() < self.critique_noise:
            said = rng.choice([c for c in CRITIQUES.values() if c != said])
        answer = f"{said} {box}" if self.critique else box
        if self.solve_first:  # the judge first writes its own solution, then compares (a one-turn CE-RM criteria)
            answer = f"={p.answer} {answer}"
        return Problem(prompt=prompt, answer=answer, meta=meta)

    def score(self, response: str, problem: Problem) -> float:
        """R_outcome: 1.0 when the judge's label is right (pointwise: its score falls on the right side of 5)."""
        label = problem.meta["label"]
        if self.mode == "pairwise":
            return float(parse_pairwise_verdict(response) == label)
        s = parse_pointwise_score(response)
        return 0.0 if s is None else float((s >= 5) == (label >= 5))


def critique_of(response: str) -> str:
    """The critique part of a judge output: the text before its first ``\\boxed``."""
    return response.split("\\boxed", 1)[0].strip()


def critique_names_error(response: str, problem: Problem) -> bool:
    """The judge's critique names the item's real error (its human critique phrase), as the
    "critique correctness" of RM-NLHF's guessing finding is read on this task."""
    return CRITIQUES.get(problem.meta["error"], problem.meta["critique"]) in critique_of(response)


COMPACT_CRITERIA = "{question}#"
"""CE-RM turn 1 for a tiny judge: the query alone; the criteria it learns to write are the expected answer."""


def gold_criteria(answer: str) -> str:
    """The unified criteria of the synthetic CE-RM task: what a right answer must be ("=052")."""
    return f"={answer}"


class CriteriaJudgeTask:
    """CE-RM's two turns on arithmetic (arXiv 2601.20327), as warm-up data and held-out evaluation items.

    Even items are turn 1 (query-only criteria: "07+45=#" -> "=052"); odd items are turn 2 (pointwise 0-10
    scoring of one candidate against the gold criteria: "=052|07+45=042?" -> "\\boxed{0}"). `instance(i)`
    gives the (query, chosen, rejected) triple the two-stage rollout trains on. Held-out items are turn-2
    items, so eval/accuracy is the evaluation stage's accuracy given right criteria.
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, **arithmetic):
        self.pointwise = ArithmeticJudgeTask(train_size, eval_size, seed, mode="pointwise", **arithmetic)
        self.base, self.seed = self.pointwise.base, seed
        self._eval = [self._evaluation(p) for p in self.pointwise.eval_problems()]

    def __len__(self) -> int:
        return len(self.base)

    def _evaluation(self, item: Problem) -> Problem:
        m = item.meta
        crit = gold_criteria(m["reference"])
        prompt = pointwise_prompt(m["question"], m["candidate"], template=COMPACT_CRITERIA_POINTWISE, criteria=crit)
        return Problem(prompt=prompt, answer=f"\\boxed{{{m['label']}}}", meta={**m, "turn": 2, "criteria": crit})

    def train(self, i: int) -> Problem:
        if i % 2 == 0:
            p = self.base.train(i // 2)
            return Problem(prompt=render_criteria(p.prompt), answer=gold_criteria(p.answer),
                           meta={"turn": 1, "question": p.prompt, "reference": p.answer})
        return self._evaluation(self.pointwise.train(i // 2))

    def eval_problems(self) -> list[Problem]:
        return self._eval

    def instance(self, i: int) -> tuple[str, str, str]:
        """(query, chosen, rejected): the right answer and a spoiled one (a pairwise item's two responses)."""
        p = self.base.train(i)
        rng = random.Random(self.seed * 7_000_003 + i)
        a, b = (int(x) for x in p.prompt.rstrip("=").replace("-", "+").split("+")[:2])
        return p.prompt, p.answer, wrong_answer(p.answer, rng.choice(ERRORS), rng, a, b)

    def score(self, response: str, problem: Problem) -> float:
        if problem.meta["turn"] == 1:
            return float(response.strip() == problem.answer)
        return self.pointwise.score(response, problem)


def render_criteria(question: str, template: str = COMPACT_CRITERIA) -> str:
    return template.replace("{question}", question)


class VerdictArithmeticTask(ArithmeticTask):
    """The arithmetic task with a verdict-format exploit within the policy's reach (task: verdict_arithmetic).

    A share `verdict_frac` of the training problems' answers (the SFT warm-up's demonstrations) ends with the
    judge's top verdict, `verdict` (default ``\\boxed{10}``): the warmed-up policy writes it now and then, so
    RL under a judge can amplify it if the judge rewards it (`judge/format_in_answer` tracks it). Prompts,
    held-out problems and the verifier are the arithmetic task's, except that the verifier scores the content:
    the response with its boxes removed ("052\\boxed{10}" is right, "042\\boxed{10}" wrong). Which problems
    carry the verdict is a pure function of (seed, index).
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, verdict_frac: float = 0.1,
                 verdict: str = "\\boxed{10}", **arithmetic):
        if not 0 <= verdict_frac <= 1:
            raise ConfigError(f"task.kwargs.verdict_frac = {verdict_frac}: expected a number in [0, 1]")
        super().__init__(train_size, eval_size, seed, **arithmetic)
        self.verdict_frac, self.verdict, self.seed = verdict_frac, verdict, seed

    def train(self, i: int) -> Problem:
        p = super().train(i)
        if random.Random(self.seed * 9_000_011 + i % len(self)).random() < self.verdict_frac:
            return Problem(prompt=p.prompt, answer=p.answer + self.verdict, meta={**p.meta, "verdict": True})
        return p

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """1.0 when the response without its boxes is the exact integer answer."""
        return ArithmeticTask.score(_BOXES.sub("", response), Problem(problem.prompt, _BOXES.sub("", problem.answer)))


_BOXES = re.compile(r"\\boxed\s*\{[^{}]*\}")
