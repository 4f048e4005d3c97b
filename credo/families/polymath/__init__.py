"""The polymath family: one-sample RL and its multi-domain evaluation (arXiv 2601.03111, "One Sample to Rule Them
All": polymath learning).

    config.py        the `polymath:` section (the one sample, its grouping, the evaluated disciplines) and its checks
    mix.py           the `polymath` task: several tasks as disciplines, a training mixture, engineered combinations
    source.py        the `one_sample` rollout source, and how polymath.sample resolves to one problem
    skill_score.py   ranks candidate samples by the skills they exercise (the generators' skill tags)
    judge_skills.py  the optional LLM-judge skill scoring (select: judge)
    evaluate.py      the multi-domain held-out evaluator: eval/<discipline> and their mean, eval/accuracy
    monitor.py       the format / diversity / sampled-NLL step hook (polymath/*)
    build.py         build-time parts: the sample at `credo check`, the evaluator, the hook

Active when the task is `polymath` or polymath.sample is set (with stages.rollout: one_sample). See docs/polymath.md.
"""

from credo.families.polymath.config import PolymathConfig, SampleConfig, check_polymath
from credo.capabilities import BATCH_STATE
from credo.family import Family, StageEntry

__all__ = ["FAMILY", "PolymathConfig", "SampleConfig"]


def _active(r) -> bool:
    p = getattr(r, "polymath", None)
    return r.task.name == "polymath" or (p is not None and p.sample is not None)


FAMILY = Family(
    name="polymath",
    doc="one-sample RL with skill-ranked and engineered samples, evaluated on many disciplines (arXiv 2601.03111)",
    section="polymath",
    config=PolymathConfig,
    check=check_polymath,
    stages={"rollout": {"one_sample": StageEntry("credo.families.polymath.source:one_sample_source",
                                                provides=frozenset({BATCH_STATE}))}},
    tasks={"polymath": "credo.families.polymath.mix:polymath_task"},
    active=_active,
    build="credo.families.polymath.build",
)
