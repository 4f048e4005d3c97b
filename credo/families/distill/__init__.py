"""The distill family: on-policy distillation (Thinking Machines, "On-Policy Distillation", 2025; GKD arXiv
2306.13649): the student samples, a frozen teacher scores every sampled token, the student is trained down the
per-token reverse KL, as a reward (the advantage is the negative log-ratio, mixed with the outcome advantage) and/or
as a loss term.

    config.py   the `distill:` section, its checks and refusal rows (teacher placement)
    teacher.py  the teacher's folder (a path, or credo's cached SFT warm-up), the tokenizer check, its scorer
    worker.py   distill.placement: worker, the teacher in its own process on this host
    stage.py    the `distill` advantage stage (the default when distill.enabled) and the distill/* metrics
    build.py    build-time parts: the teacher's check at preflight, its warm-up

distill.placement: ray runs the teacher as Ray actors (`credo.distributed.ray.teacher`, role cluster.teacher).
The pure functions are `credo.algos.distill`. See docs/distill.md.
"""

from credo.families.distill.config import REFUSALS, DistillConfig, TeacherRoleConfig, check_distill
from credo.family import Family, StageEntry


def _section(r):
    return getattr(r, "distill", None)


def _active(r) -> bool:
    d = _section(r)
    return d is not None and d.enabled


def _stage_defaults(r) -> dict:
    return {"advantage": "distill"} if _active(r) else {}


FAMILY = Family(
    name="distill",
    doc="On-policy distillation: per-token reverse KL to a teacher on the student's samples (Thinking Machines 2025; "
        "GKD arXiv 2306.13649)",
    section="distill",
    config=DistillConfig,
    check=check_distill,
    stages={"advantage": {"distill": StageEntry("credo.families.distill.stage:make_distill")}},
    active=_active,
    stage_defaults=_stage_defaults,
    refusals=REFUSALS,
    fixed_on_resume=("distill.teacher", "distill.teacher_sft"),
    build="credo.families.distill.build",
    roles={"teacher": TeacherRoleConfig},
)
