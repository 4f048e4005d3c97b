"""Build-time parts of the distill family (`credo.family`): the teacher's check at preflight, its warm-up."""

from __future__ import annotations

import dataclasses

from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """The teacher's folder and tokenizer (`credo.families.distill.teacher.check_teacher`), before any warm-up; with
    distill.placement: ray, that a node of the cluster can place a teacher actor (cluster.teacher.resources; the sum
    over every role the run uses is `credo check`'s capacity check, which counts the teacher's actors)."""
    from credo.families.distill.teacher import check_teacher

    notes = []
    d, c = r.distill, r.cluster
    if d.enabled and d.placement == "ray" and c.engine == "ray" and c.teacher.workers:
        from credo.preflight import check_cluster_placement

        notes += check_cluster_placement(r, ("teacher",))
    return notes + check_teacher(r)


def warmup(r, task, policy_path: str, *, log) -> tuple[str, str | None]:
    """With distill.teacher: warmup, trains (or reuses) the teacher's cached SFT warm-up; the policy is unchanged.
    The teacher's key joins the run's warm-up key, so a resume with another teacher is refused."""
    from credo.families.distill.teacher import teacher_folder

    _, key = teacher_folder(r, task, log=log)
    return policy_path, None if key is None else f"teacher-{key}"


def warmup_plan(r, task, policy_path: str | None, base_path: str) -> dict | None:
    """`credo check`'s view of a warm-up teacher (credo.warmup_estimate): credo's SFT warm-up under the teacher's sft
    settings (its steps, work and whether it is cached); None for a teacher folder."""
    from credo.families.distill.config import WARMUP_TEACHER
    from credo.families.distill.teacher import teacher_recipe
    from credo.models import cache_root
    from credo.sft import sft_cache_key
    from credo.warmup_estimate import sft_plan

    if r.distill.teacher != WARMUP_TEACHER:
        return None
    t = teacher_recipe(r)
    forced = teacher_recipe(r)  # the teacher's warm-up runs whatever sft.enabled says; its key keeps the value
    object.__setattr__(forced, "sft", dataclasses.replace(t.sft, enabled=True))
    plan = sft_plan(forced, base_path, task)
    if plan is None or plan["cached"] is None:  # no steps; or weights too large to hash here
        return None if plan is None else {**plan, "name": "distill teacher"}
    folder = cache_root() / "sft" / sft_cache_key(t, base_path)
    return {**plan, "name": "distill teacher", "cached": (folder / "COMPLETE").exists(), "folder": str(folder)}


PARTS = FamilyParts(preflight=preflight, warmup=warmup, warmup_plan=warmup_plan)
