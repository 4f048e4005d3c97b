"""One-sample RL (arXiv 2601.03111): the `one_sample` rollout source and the resolution of `polymath.sample`.

The batch of step t is rollout.prompts_per_step copies of the one sample, each answered group_size times:

    row c * G + g  =  copy c, response g;   its sampling seed = step_seed(run seed, t, 1 + c * G + g)

so seeds are functions of (run seed, step, copy, response), as the default source's are of (run seed, step,
prompt, response): a resumed run draws the same responses, and the source has nothing to save. Each copy is its
own advantage group (`polymath.group: copy`, 1-shot RLVR's duplicated batch; inferred), or the whole batch is one
(`group: all`). Under data parallelism each rank rolls out its share of the copies, as with the default source.
"""

from __future__ import annotations

import logging

import torch

from credo.errors import ConfigError
from credo.families.polymath.mix import PolymathTask, single
from credo.tasks.problem import Problem
from credo.train.batch import Batch
from credo.train.rollout import PromptRollout


def disciplines_of(task, task_name: str) -> PolymathTask:
    """The run's task as disciplines: a polymath task itself, any other task as one discipline named after it."""
    return task if isinstance(task, PolymathTask) else single(task, task_name)


def eval_disciplines(section, pt: PolymathTask) -> list[str]:
    """polymath.eval_disciplines, each checked, or every natural discipline."""
    names = list(section.eval_disciplines) or pt.natural
    for i, d in enumerate(names):
        if d not in pt.disciplines:
            raise ConfigError(f"config key 'polymath.eval_disciplines[{i}]' = '{d}' is not a discipline of the task "
                              f"(known: {', '.join(pt.disciplines)})")
    if "accuracy" in names:
        raise ConfigError("config key 'polymath.eval_disciplines': a discipline named 'accuracy' would overwrite "
                          "eval/accuracy (the mean over disciplines); rename it")
    return names


def _verified(problem: Problem, pt: PolymathTask, where: str) -> Problem:
    """`problem` if its discipline's verifier accepts its own reference answer; else a ConfigError naming `where`."""
    d = problem.meta["discipline"]
    try:
        score = pt.score(problem.answer, problem)
    except KeyError as e:
        raise ConfigError(f"config key '{where}': the verifier of '{d}' reads meta key {e} of the sample, which it "
                          f"lacks (set polymath.sample.meta)") from None
    if score != 1.0:
        raise ConfigError(f"config key '{where}': the verifier of '{d}' scores the sample's own reference answer "
                          f"{score} (expected 1.0), so no response could be rewarded as right: check "
                          "polymath.sample.answer and polymath.sample.meta")
    return problem


def resolve_sample(section, task, task_name: str) -> tuple[Problem, str]:
    """The one training sample `polymath.sample` names, and a line saying which it is (and why)."""
    s, pt = section.sample, disciplines_of(task, task_name)
    if s.prompt is not None:
        if s.verifier not in pt.disciplines:
            raise ConfigError(f"config key 'polymath.sample.verifier' = '{s.verifier}' is not a discipline of the "
                              f"task, so the sample has no verifier (known: {', '.join(pt.disciplines)})")
        meta = {**s.meta, "discipline": s.verifier}
        meta.setdefault("skills", {})
        problem = _verified(Problem(prompt=s.prompt, answer=s.answer, meta=meta), pt, "polymath.sample.verifier")
        return problem, f"inline sample verified by '{s.verifier}'"
    if s.discipline is not None and s.discipline not in pt.disciplines:
        raise ConfigError(f"config key 'polymath.sample.discipline' = '{s.discipline}' is not a discipline of the "
                          f"task (known: {', '.join(pt.disciplines)})")
    if s.select == "index":
        d = s.discipline
        if d is None:
            if len(pt.disciplines) > 1:
                raise ConfigError("config key 'polymath.sample.discipline' is not set: the task has the disciplines "
                                  f"{', '.join(pt.disciplines)}; name the one the sample comes from")
            d = pt.disciplines[0]
        if s.index >= pt.discipline_size(d):
            raise ConfigError(f"config key 'polymath.sample.index' = {s.index} is out of range: discipline '{d}' has "
                              f"{pt.discipline_size(d)} training problems")
        key, why = (d, s.index), "named by index"
    else:
        key, why = _selected(section, pt)
    return _verified(pt.discipline_train(*key), pt, "polymath.sample"), f"{key[0]}[{key[1]}], {why}"


def _selected(section, pt: PolymathTask) -> tuple[tuple[str, int], str]:
    """(discipline, index) of the best-ranked candidate (select: skills or judge), and why."""
    from credo.families.polymath.skill_score import best_sample

    s = section.sample
    pool = [s.discipline] if s.discipline is not None else pt.natural
    wanted = eval_disciplines(section, pt)
    if s.select == "judge":
        from credo.families.polymath.judge_skills import judged_best

        (key, score, _), fallbacks = judged_best(pt, pool, wanted, s.candidates, section.judge_path,
                                                 section.judge_max_new_tokens)
        return key, f"judge skill score {score:.3f} ({fallbacks} candidates fell back to their tags)"
    key, score, _ = best_sample(pt, pool, wanted, s.candidates)
    return key, f"best skill score {score:.3f} of {s.candidates} candidates per discipline of {', '.join(pool)}"


class _Repeated:
    """A task of one training problem (the default source then draws it for every prompt of a step)."""

    def __init__(self, problem: Problem):
        self.problem = problem

    def __len__(self) -> int:
        return 1

    def train(self, i: int) -> Problem:
        return self.problem


class OneSampleRollout:
    """prompts_per_step copies of one problem, group_size responses each (see the module docstring)."""

    def __init__(self, problem: Problem, tokenizer, backend, *, group: str = "copy", **prompt_rollout):
        self.problem, self.group, self.backend = problem, group, backend
        self.inner = PromptRollout(_Repeated(problem), tokenizer, backend, **prompt_rollout)

    def rollout(self, step: int) -> Batch:
        batch = self.inner.rollout(step)
        if self.group == "all":
            batch.group_ids = torch.zeros_like(batch.group_ids)
        return batch

    def generate(self, prompts, *, temperature: float, seeds):
        return self.inner.generate(prompts, temperature=temperature, seeds=seeds)

    def sync(self, model, step: int) -> None:
        self.inner.sync(model, step)

    def state_dict(self) -> dict:
        return {}  # copies and seeds are functions of (seed, step): nothing to save

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        self.inner.close()


def one_sample_source(ctx, **kwargs) -> OneSampleRollout:
    """stages.rollout: one_sample; its settings are the `polymath:` section (ctx.section)."""
    if kwargs:
        raise ConfigError(f"config key 'stages.rollout_kwargs': the one_sample source takes its settings from the "
                          f"polymath: section, got {sorted(kwargs)}")
    if ctx.section is None or ctx.section.sample is None:
        raise ConfigError("config key 'stages.rollout' = 'one_sample' needs polymath.sample")
    problem, which = resolve_sample(ctx.section, ctx.task, ctx.task_config.name)
    if ctx.rank == 0:
        logging.getLogger("credo").info("polymath: training on one sample, %s: %r -> %r (skills %s)", which,
                                        problem.prompt, problem.answer, problem.meta.get("skills"))
    return OneSampleRollout(problem, ctx.tokenizer, ctx.backend, group=ctx.section.group, seed=ctx.seed,
                            rank=ctx.rank, world=ctx.world, render=ctx.render, **ctx.rollout)
