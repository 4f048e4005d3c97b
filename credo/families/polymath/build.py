"""Build-time parts of the polymath family (`credo.family`): the sample and the disciplines at `credo check`, the
multi-domain evaluator and the monitor hook."""

from __future__ import annotations

from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """polymath.sample resolves to a problem its verifier accepts (select: judge only checks the judge's folder),
    and polymath.eval_disciplines are disciplines of the task. Returns a note naming the sample."""
    from credo.families.polymath.source import disciplines_of, eval_disciplines, resolve_sample
    from credo.family import families_of
    from credo.preflight import check_model
    from credo.tasks import make_task

    p = r.polymath
    task = make_task(r.task, families_of(r))
    eval_disciplines(p, disciplines_of(task, r.task.name))
    if p.sample is None:
        return []
    if p.sample.select == "judge":
        return check_model(p.judge_path, key="polymath.judge_path") + [
            "polymath.sample: chosen by the judge when the run starts"]
    problem, which = resolve_sample(p, task, r.task.name)
    return [f"polymath.sample: {which}: {problem.prompt!r} -> {problem.answer!r}"]


def evaluator(ctx, source, temperature: float):
    """eval/accuracy (the mean over disciplines) and eval/<discipline> on the task's held-out problems."""
    from credo.families.polymath.evaluate import MultiDomainEvaluator
    from credo.families.polymath.source import disciplines_of, eval_disciplines

    pt = disciplines_of(ctx.task, ctx.task_config.name)
    return MultiDomainEvaluator(pt, eval_disciplines(ctx.section, pt), ctx.tokenizer, source, seed=ctx.seed,
                                temperature=temperature, samples=ctx.eval_samples, rank=ctx.rank, world=ctx.world,
                                render=ctx.render, max_new_tokens=ctx.section.eval_max_new_tokens)


def hooks(ctx, parts) -> list:
    """The format / diversity / sampled-NLL monitor, unless polymath.monitor is off."""
    from credo.families.polymath.monitor import PolymathMonitor

    return [PolymathMonitor(ctx.tokenizer)] if ctx.section.monitor else []


PARTS = FamilyParts(preflight=preflight, evaluator=evaluator, hooks=hooks)
