"""The distill family's recipe section (`distill:`), its load-time checks and its refusal rows (on-policy
distillation: Thinking Machines, "On-Policy Distillation", 2025; GKD, arXiv 2306.13649)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from credo.capabilities import Refusal
from credo.config import SFTConfig, one_of, out_of_range, ranged
from credo.config.sections import RoleConfig
from credo.errors import ConfigError

WARMUP_TEACHER = "warmup"
"""`distill.teacher` value naming credo's own cached SFT warm-up (with `distill.teacher_sft`) as the teacher."""


@dataclass
class DistillConfig:
    enabled: bool = False
    """On-policy distillation: a frozen teacher scores each token the student sampled; the student is trained down
    the per-token reverse KL log pi_student(y_t) - log pi_teacher(y_t) (docs/distill.md)."""
    teacher: str = ""
    """The teacher: a model folder (any Hugging Face causal LM saved with save_pretrained, e.g. a credo run's final/),
    or 'warmup': credo's cached SFT warm-up of model.path with distill.teacher_sft's keys in place of sft's."""
    teacher_sft: dict = field(default_factory=dict)
    """With teacher 'warmup': keys of the sft section that the teacher's warm-up changes (e.g. noisy_frac: 0.0,
    steps: 1200); the others are the recipe's sft settings. Cached under $CREDO_CACHE/sft like credo's warm-up."""
    weight: float = ranged(1.0, ge=0, le=1)
    """Reward form (Thinking Machines): advantage = (1 - weight) * the outcome advantage + weight * (-log-ratio);
    1 = pure distillation, 0 = the outcome advantage alone (then only the loss term distils; with loss_coef 0 too,
    the teacher only measures: distill/* is logged and the run trains as without the family)."""
    discount: float = ranged(0.0, ge=0, le=1)
    """Reward form: each token's distillation advantage sums the later tokens' -log-ratio discounted by this;
    0 (Thinking Machines') = each token its own."""
    loss_coef: float = ranged(0.0, ge=0, note="0 = off")
    """Loss-term form: coefficient of aggregate((log pi_theta - log pi_teacher)^2 / 2) added to the policy loss
    (its gradient is the per-token reverse KL's on-policy); logged as train/distill_kl."""
    placement: str = one_of("trainer", ("trainer", "worker", "ray"))
    """Where the teacher runs: 'trainer' (a frozen copy beside the policy, on its device); 'worker' (its own process
    on this host, spawned at start-up, on the trainer's device, gone with the run); 'ray' (cluster.teacher.workers
    Ray actors placed by cluster.teacher.resources, with cluster.engine: ray). All three load the same folder in
    model.dtype and score in the same row chunks, so the teacher's log-probs are bitwise the same on the same kind
    of device (docs/distill.md)."""
    token_mapping: str = ""
    """A vocabulary mapping for a teacher whose tokenizer differs from the student's. Not implemented: any value
    is refused; a teacher must share the student's tokenizer (as GKD and Thinking Machines assume)."""


@dataclass
class TeacherRoleConfig(RoleConfig):
    """`cluster.teacher:`: the distillation teacher as Ray actors (distill.placement: ray). Each actor loads the
    teacher and scores whole row chunks of a batch; a killed or hung actor is replaced and its chunks scored again."""

    threads: int = ranged(0, ge=0)
    """torch intra-op threads of each teacher actor; 0 = the trainer's (run.threads): bitwise parity with
    distill.placement: trainer on CPU needs the same count."""


SFT_KEYS = tuple(f.name for f in dataclasses.fields(SFTConfig))
"""The keys distill.teacher_sft may set."""


def teacher_sft_config(r) -> SFTConfig:
    """The sft section of the teacher's warm-up: the recipe's with distill.teacher_sft's keys in their place, each
    checked as the sft key is (an error names distill.teacher_sft.<key>)."""
    from credo.config import check_fields

    s = dataclasses.replace(r.sft, **r.distill.teacher_sft)
    for k, v in r.distill.teacher_sft.items():
        want = type(getattr(r.sft, k)) if getattr(r.sft, k) is not None else (int if k == "seed" else bool)
        if isinstance(v, bool) != (want is bool) or not isinstance(v, (want, int) if want is float else want):
            raise out_of_range(f"distill.teacher_sft.{k}", v, f"a {want.__name__}, as sft.{k}")
    check_fields(s, "distill.teacher_sft")
    return s


def check_distill(r) -> None:
    """The distill settings against the core keys, each error naming the key."""
    d = r.distill
    if d.token_mapping:
        raise ConfigError(f"config key 'distill.token_mapping' = '{d.token_mapping}': cross-tokenizer distillation is "
                          "not implemented; the teacher must share the student's tokenizer (docs/distill.md says "
                          "what ULD and DSKD do instead)")
    for k in d.teacher_sft:
        if k not in SFT_KEYS:
            from credo.family import close_names

            raise ConfigError(f"config key 'distill.teacher_sft.{k}' is not a key of the sft section"
                              f"{close_names(str(k), list(SFT_KEYS))} (known: {', '.join(SFT_KEYS)})")
    teacher_sft_config(r)
    if not d.enabled:
        return
    if not d.teacher:
        raise ConfigError("config key 'distill.teacher' is empty with distill.enabled: expected a model folder or "
                          f"'{WARMUP_TEACHER}' (credo's SFT warm-up with distill.teacher_sft)")
    if d.teacher_sft and d.teacher != WARMUP_TEACHER:
        raise ConfigError(f"config key 'distill.teacher_sft' is set but distill.teacher = '{d.teacher}': it only "
                          f"applies with distill.teacher: {WARMUP_TEACHER}")
    if r.stages.advantage not in ("default", "distill"):
        raise ConfigError(f"config key 'stages.advantage' = '{r.stages.advantage}' cannot be used with "
                          "distill.enabled: the distill stage is the advantage stage (it wraps the outcome one)")


def _placement(value: str):
    return lambda r, plan: r.distill.enabled and r.distill.placement == value


def _sampling(key: str, off):
    return lambda r, plan: r.distill.enabled and not off(getattr(r.rollout, key))


def _teacher_workers(r) -> int:
    role = getattr(r.cluster, "teacher", None)
    return role.workers if role is not None else 0


_TRUNCATED = ("the teacher's log-probs are full-vocabulary ones at temperature 1 and the sampler's over its kept set: "
              "their log-ratio would not estimate the reverse KL")

REFUSALS = (
    Refusal(("distill.enabled", "rollout.temperature"), _sampling("temperature", lambda v: v == 1.0),
            "the reverse KL compares the student's sampling distribution with the teacher's, both at temperature 1"),
    Refusal(("distill.enabled", "rollout.top_p"), _sampling("top_p", lambda v: v == 1.0), _TRUNCATED),
    Refusal(("distill.enabled", "rollout.top_k"), _sampling("top_k", lambda v: v == 0), _TRUNCATED),
    Refusal(("distill.enabled", "rollout.min_p"), _sampling("min_p", lambda v: v == 0), _TRUNCATED),
    Refusal(("distill.placement", "cluster.engine"),
            lambda r, plan: _placement("ray")(r, plan) and r.cluster.engine != "ray",
            "the teacher's Ray actors run on the run's Ray cluster (cluster.engine: ray); distill.placement: worker "
            "runs the teacher in its own process on this host"),
    Refusal(("distill.placement", "cluster.teacher.workers"),
            lambda r, plan: _placement("ray")(r, plan) and r.cluster.engine == "ray" and not _teacher_workers(r),
            "with no teacher actor nothing would score the samples: set cluster.teacher.workers >= 1, or "
            "distill.placement: trainer"),
    Refusal(("distill.enabled", "palette.enabled"),
            lambda r, plan: r.distill.enabled and getattr(getattr(r, "palette", None), "enabled", False),
            "the teacher does not read the palette's soft prefixes the student was sampled with"),
)
"""Placements `credo check` refuses (checked by the run plan with every other row)."""
