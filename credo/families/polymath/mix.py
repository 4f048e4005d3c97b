"""`polymath`: several tasks as the disciplines of one task: a mixed training set and a held-out split per discipline.

    task:
      name: polymath
      train_size: 20000            # the training mixture: the "full data set" one-sample RL is compared with
      eval_size: 100               # held-out problems per discipline
      kwargs:
        disciplines:
          add:   {task: add_scratch, kwargs: {digits: 2}}
          sort:  {task: sort, kwargs: {length: 6}}
          spell: {task: "rg:spell_backward", kwargs: {min_word_len: 3, max_word_len: 5}}
          combo: {combine: [add, sort]}        # engineered: one prompt made of one problem of each part
        weights: {add: 1, sort: 1, spell: 1, combo: 0.5}   # the mixture's draw probabilities; default equal

Each discipline is any credo task with a verifier (built with the task's seed and `eval_size`). Training problem i
is drawn from discipline d with probability weight_d / sum(weights) (seeded by the task seed), the disciplines'
own training problems taken in order. Every problem carries `meta['discipline']` and `meta['skills']` (the
generator's skill tags, `credo.tasks.skill_tags`; a task that writes none is tagged 'task:<name>').

A combined discipline's problem joins one training (held-out) problem of each part, drawn with the task seed, with
'|': prompt `47+86=|sort:qwhd=`, answer `7+6+0=13,4+8+1=13>133|dhqw`. Its reward is the share of parts whose piece
of the response (split at '|') the part's verifier accepts (inferred: the paper's engineered sample is one
natural-language problem; a tiny model needs a format it has been warmed up on). Its skills are the parts' skills
summed.
"""

from __future__ import annotations

import random
import re
from typing import Any

from credo.errors import ConfigError
from credo.tasks.problem import Problem
from credo.tasks.skill_tags import merge_skills

SEP = "|"
"""Joins the parts of a combined problem (prompts, answers, and the response's pieces)."""


def tagged(problem: Problem, discipline: str, task_name: str) -> Problem:
    """A copy of `problem` with its discipline and skill tags in meta (its own meta kept: the verifier reads it)."""
    skills = problem.meta.get("skills") or {f"task:{task_name}": 1}
    return Problem(prompt=problem.prompt, answer=problem.answer,
                   meta={**problem.meta, "discipline": discipline, "skills": dict(skills)})


def combined(parts: list[Problem], discipline: str) -> Problem:
    """One problem made of `parts` (each tagged with its discipline): prompts and answers joined with SEP."""
    for p in parts:
        if not isinstance(p.prompt, str) or SEP in p.prompt or SEP in p.answer:
            raise ConfigError(f"task.kwargs.disciplines.{discipline}: part '{p.meta['discipline']}' has a chat prompt "
                              f"or a '{SEP}' in its prompt or answer; a combined discipline joins plain-text parts with "
                              f"'{SEP}'")
    return Problem(prompt=SEP.join(p.prompt for p in parts), answer=SEP.join(p.answer for p in parts),
                   meta={"discipline": discipline, "skills": merge_skills(*(p.meta["skills"] for p in parts)),
                         "parts": [{"prompt": p.prompt, "answer": p.answer, "meta": p.meta} for p in parts]})


class PolymathTask:
    """Disciplines (built tasks) and combinations of them as one task (see the module docstring).

    Args:
        tasks: discipline -> a built task with `train`, `__len__`, `eval_problems` and `score`.
        combos: discipline -> the disciplines (of `tasks`) one problem of it combines.
        order: the training mixture, (discipline, index in it) per training problem.
        names: discipline -> the task name it was built from (for tags and messages).
    """

    def __init__(self, tasks: dict[str, Any], combos: dict[str, list[str]], order: list[tuple[str, int]], *,
                 names: dict[str, str], seed: int, eval_size: int):
        self.tasks, self.combos, self.order, self.names = tasks, combos, order, names
        self.disciplines = list(tasks) + list(combos)
        """Every discipline, natural first, in declaration order."""
        self.natural = list(tasks)
        """The disciplines that are tasks of their own (not combinations)."""
        self._eval = {d: [tagged(p, d, names[d]) for p in t.eval_problems()] for d, t in tasks.items()}
        self._combo_train, self._combo_eval = {}, {}
        for d, parts in combos.items():
            rng = random.Random(f"{seed}:{d}")
            n_train = max(1, sum(1 for name, _ in order if name == d))
            self._combo_train[d] = [[rng.randrange(len(tasks[p])) for p in parts] for _ in range(n_train)]
            self._combo_eval[d] = [[rng.randrange(len(self._eval[p])) for p in parts] for _ in range(eval_size)]

    def __len__(self) -> int:
        return len(self.order)

    def train(self, i: int) -> Problem:
        return self.discipline_train(*self.order[i % len(self.order)])

    def discipline_size(self, d: str) -> int:
        """Training problems of discipline `d`."""
        return len(self._combo_train[d]) if d in self.combos else len(self.tasks[d])

    def discipline_train(self, d: str, k: int) -> Problem:
        """Training problem `k` of discipline `d` (modulo its size), tagged."""
        if d in self.combos:
            picks = self._combo_train[d][k % len(self._combo_train[d])]
            return combined([self.discipline_train(p, j) for p, j in zip(self.combos[d], picks)], d)
        return tagged(self.tasks[d].train(k % len(self.tasks[d])), d, self.names[d])

    def discipline_eval(self, d: str) -> list[Problem]:
        """The held-out problems of discipline `d`, tagged."""
        if d in self.combos:
            return [combined([self._eval[p][j] for p, j in zip(self.combos[d], picks)], d)
                    for picks in self._combo_eval[d]]
        return list(self._eval[d])

    def eval_problems(self) -> list[Problem]:
        return [p for d in self.disciplines for p in self.discipline_eval(d)]

    def score(self, response: str, problem: Problem) -> float:
        """The verifier of the problem's discipline; a combined problem scores the share of parts right."""
        parts = problem.meta.get("parts")
        if parts is None:
            return float(self.tasks[problem.meta["discipline"]].score(response, problem))
        pieces = response.strip().split(SEP)
        right = 0.0
        for i, part in enumerate(parts):
            if i < len(pieces):
                sub = Problem(prompt=part["prompt"], answer=part["answer"], meta=part["meta"])
                right += float(self.tasks[part["meta"]["discipline"]].score(pieces[i], sub))
        return right / len(parts)


def single(task: Any, name: str) -> PolymathTask:
    """Another task as a polymath task of one discipline named `name` (its training problems in order)."""
    return PolymathTask({name: task}, {}, [(name, i) for i in range(len(task))], names={name: name}, seed=0,
                        eval_size=0)


_RUN = re.compile(r"-?\d+|[A-Za-z]+|\s+|.", re.DOTALL)


def answer_shape(answer: str) -> re.Pattern:
    """The format of a reference answer: its digit runs (with an optional sign), letter runs and whitespace runs
    abstracted, every other character kept: `7+6+0=13,4+8+1=13>133` -> `-?\\d+\\+-?\\d+...>-?\\d+`. A response is in
    the expected format when it matches the whole pattern (inferred: the paper's format monitor is not specified)."""
    out = []
    for run in _RUN.findall(answer.strip()):
        if run[-1].isdigit():
            out.append(r"-?\d+")
        elif run.isalpha() and run.isascii():
            out.append(r"[A-Za-z]+")
        elif run.isspace():
            out.append(r"\s+")
        else:
            out.append(re.escape(run))
    return re.compile("".join(out))


def format_ok(response: str, problem: Problem) -> bool:
    """Whether the response has the shape of the problem's reference answer (`answer_shape`)."""
    return answer_shape(problem.answer).fullmatch(response.strip()) is not None


def _spec(d: str, spec: Any) -> tuple[str | None, dict, list[str] | None]:
    """(task name, kwargs, combined parts) of discipline `d`'s spec, each key checked."""
    key = f"task.kwargs.disciplines.{d}"
    if not isinstance(spec, dict):
        raise ConfigError(f"config key '{key}' = {spec!r}: expected {{task: NAME, kwargs: {{...}}}} or "
                          "{combine: [DISCIPLINE, ...]}")
    unknown = sorted(set(spec) - {"task", "kwargs", "combine"})
    if unknown:
        raise ConfigError(f"unknown config key '{key}.{unknown[0]}' (valid: task, kwargs, combine)")
    if ("task" in spec) == ("combine" in spec):
        raise ConfigError(f"config key '{key}': expected exactly one of 'task' (a task) and 'combine' (a list of "
                          "disciplines)")
    if "combine" in spec:
        parts = spec["combine"]
        if not isinstance(parts, list) or len(parts) < 2 or not all(isinstance(p, str) for p in parts):
            raise ConfigError(f"config key '{key}.combine' = {parts!r}: expected a list of two or more disciplines")
        return None, {}, parts
    kwargs = spec.get("kwargs") or {}
    if not isinstance(spec["task"], str) or not isinstance(kwargs, dict):
        raise ConfigError(f"config key '{key}': expected task: NAME (a string) and kwargs: a mapping")
    if spec["task"] == "polymath":
        raise ConfigError(f"config key '{key}.task' = 'polymath': a discipline cannot itself be a polymath task")
    return spec["task"], dict(kwargs), None


def _mixture(names: list[str], weights: dict | None, train_size: int, seed: int) -> list[tuple[str, int]]:
    """The training mixture: (discipline, its k-th training problem) per draw, disciplines drawn by weight."""
    w = {d: 1.0 for d in names} if weights is None else weights
    if not isinstance(w, dict):
        raise ConfigError(f"config key 'task.kwargs.weights' = {w!r}: expected a mapping discipline -> weight")
    for d, v in w.items():
        if d not in names:
            raise ConfigError(f"config key 'task.kwargs.weights.{d}' names no discipline (known: {', '.join(names)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ConfigError(f"config key 'task.kwargs.weights.{d}' = {v!r}: expected a number >= 0")
    probs = [float(w.get(d, 0.0)) for d in names]
    if not sum(probs) > 0:
        raise ConfigError("config key 'task.kwargs.weights': every weight is 0; expected one > 0")
    drawn = random.Random(seed + 1).choices(names, weights=probs, k=train_size)
    seen: dict[str, int] = {}
    order = []
    for d in drawn:
        order.append((d, seen.get(d, 0)))
        seen[d] = seen.get(d, 0) + 1
    return order


def polymath_task(train_size: int, eval_size: int, seed: int, disciplines: dict | None = None,
                  weights: dict | None = None) -> PolymathTask:
    """The `polymath` task (task.kwargs: disciplines, weights; see the module docstring)."""
    from credo.config import TaskConfig
    from credo.tasks import make_task

    if not isinstance(disciplines, dict) or not disciplines:
        raise ConfigError("config key 'task.kwargs.disciplines' is not set: expected a mapping name -> "
                          "{task: NAME, kwargs: {...}} (or {combine: [NAME, ...]}) of two or more disciplines")
    specs = {d: _spec(d, s) for d, s in disciplines.items()}
    order = _mixture(list(specs), weights, train_size, seed)
    tasks, combos, names = {}, {}, {}
    for d, (name, kwargs, parts) in specs.items():
        if parts is not None:
            continue
        n = max(1, sum(1 for x, _ in order if x == d))
        try:
            tasks[d] = make_task(TaskConfig(name=name, train_size=n, eval_size=eval_size, seed=seed, kwargs=kwargs))
        except ConfigError as e:
            raise ConfigError(f"config key 'task.kwargs.disciplines.{d}': {e}") from None
        if getattr(tasks[d], "score", None) is None:
            raise ConfigError(f"config key 'task.kwargs.disciplines.{d}.task' = '{name}' has no verifier: a "
                              "discipline is scored by its task's verifier (file and hf tasks have none)")
        names[d] = name
    for d, (_, _, parts) in specs.items():
        if parts is not None:
            bad = [p for p in parts if p not in tasks]
            if bad:
                raise ConfigError(f"config key 'task.kwargs.disciplines.{d}.combine' names '{bad[0]}', which is not a "
                                  f"task discipline (known: {', '.join(tasks)})")
            combos[d], names[d] = list(parts), "combine"
    return PolymathTask(tasks, combos, order, names=names, seed=seed, eval_size=eval_size)
