"""Build-time parts of the distill family (`credo.family`): the teacher's check at preflight, its warm-up."""

from __future__ import annotations

from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """The teacher's folder and tokenizer (`credo.families.distill.teacher.check_teacher`), before any warm-up."""
    from credo.families.distill.teacher import check_teacher

    return check_teacher(r)


def warmup(r, task, policy_path: str, *, log) -> tuple[str, str | None]:
    """With distill.teacher: warmup, trains (or reuses) the teacher's cached SFT warm-up; the policy is unchanged.
    The teacher's key joins the run's warm-up key, so a resume with another teacher is refused."""
    from credo.families.distill.teacher import teacher_folder

    _, key = teacher_folder(r, task, log=log)
    return policy_path, None if key is None else f"teacher-{key}"


PARTS = FamilyParts(preflight=preflight, warmup=warmup)
