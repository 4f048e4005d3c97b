"""The polymath family's recipe section (`polymath:`) and its load-time checks (arXiv 2601.03111)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from credo.config import one_of, out_of_range, ranged
from credo.errors import ConfigError

SELECT = ("index", "skills", "judge")


@dataclass
class SampleConfig:
    """The one training sample: a training problem of the run's task (by index, or the best by skill score), or an
    inline prompt and answer with the verifier that checks it."""

    discipline: Optional[str] = None
    """The discipline of the run's `polymath` task the sample comes from (null with another task: that task; with
    select: skills or judge, null ranks every discipline but the engineered ones)."""
    index: Optional[int] = None
    """The sample's index among the discipline's training problems (select: index)."""
    select: str = one_of("index", SELECT)
    """How the sample is chosen: index (the one named), skills (the highest skill score among the first
    `candidates` training problems, credo.families.polymath.skill_score) or judge (the same, scored by an LLM
    judge: polymath.judge_path; optional)."""
    candidates: int = ranged(64, ge=1)
    """Training problems per discipline that select: skills / judge ranks."""
    prompt: Optional[str] = None
    """An inline sample's prompt (then `answer` and `verifier` are required, and discipline / index unused)."""
    answer: Optional[str] = None
    """An inline sample's reference answer (the verifier must accept it)."""
    verifier: Optional[str] = None
    """The discipline (of the polymath task) or, with another task, the task name whose verifier scores the inline
    sample; a sample with none cannot be rewarded."""
    meta: dict = field(default_factory=dict)
    """An inline sample's Problem.meta, as its verifier reads it (add_scratch: {result: 133})."""


@dataclass
class PolymathConfig:
    sample: Optional[SampleConfig] = None
    """The one training sample (needs stages.rollout: one_sample); null = train on the task's data as usual."""
    group: str = one_of("copy", ("copy", "all"))
    """Advantage groups of the one-sample batch: copy = each of the rollout.prompts_per_step copies is a group of
    group_size responses (1-shot RLVR's duplicated batch, inferred); all = the whole batch is one group."""
    eval_disciplines: list = field(default_factory=list)
    """Disciplines of the polymath task the held-out evaluation logs (eval/<discipline>); [] = every discipline
    that is not an engineered combination."""
    eval_max_new_tokens: int = ranged(0, ge=0)
    """Generation cap of the held-out evaluation (0 = rollout.max_new_tokens); the evaluated disciplines' answers
    may be far shorter than the longest training answer (an engineered combination)."""
    monitor: bool = True
    """Log the format, diversity and sampled-NLL monitors every step (polymath/*)."""
    judge_path: Optional[str] = None
    """The LLM judge of select: judge (a model folder or hub id); scores each candidate's skills 0-10."""
    judge_max_new_tokens: int = ranged(48, ge=1)
    """Generation cap of one skill judgement."""


def check_polymath(r) -> None:
    """The sample names a sample in one way, and the one-sample source and the sample go together."""
    p, one = r.polymath, r.stages.rollout == "one_sample"
    if one and p.sample is None:
        raise ConfigError("config key 'stages.rollout' = 'one_sample' needs the sample: set polymath.sample "
                          "(e.g. {discipline: add, index: 0} or {discipline: add, select: skills})")
    if p.sample is None:
        return
    if not one:
        raise ConfigError(f"config key 'polymath.sample' is set but stages.rollout is '{r.stages.rollout}': expected "
                          "stages.rollout: one_sample (the source that repeats the sample)")
    s = p.sample
    if s.prompt is not None:
        check_inline(s)
    elif s.answer is not None or s.verifier is not None or s.meta:
        raise ConfigError("config key 'polymath.sample.answer' / 'verifier' / 'meta' describe an inline sample, "
                          "whose prompt is missing: set polymath.sample.prompt")
    elif s.select == "index" and s.index is None:
        raise ConfigError("config key 'polymath.sample.index' is not set: expected the training problem's index "
                          "(or polymath.sample.select: skills)")
    elif s.index is not None and s.index < 0:
        raise out_of_range("polymath.sample.index", s.index, ">= 0")
    elif s.select != "index" and s.index is not None:
        raise ConfigError(f"config key 'polymath.sample.index' = {s.index} is set with select: {s.select}, which "
                          "chooses the sample itself: expected one of them")
    if s.select == "judge" and not p.judge_path:
        raise ConfigError("config key 'polymath.judge_path' is not set: polymath.sample.select = 'judge' needs "
                          "the judge model")


def check_inline(s: SampleConfig) -> None:
    """An inline sample has an answer and, above all, a verifier: without one it cannot be rewarded."""
    if s.answer is None:
        raise ConfigError("config key 'polymath.sample.answer' is not set: an inline sample needs its reference "
                          "answer")
    if not s.verifier:
        raise ConfigError("config key 'polymath.sample.verifier' is not set: the one training sample has no verifier, "
                          "so no response to it can be rewarded; name the discipline (or task) whose verifier "
                          "checks it")
    if s.discipline is not None or s.index is not None or s.select != "index":
        raise ConfigError("config key 'polymath.sample.prompt' is set with discipline / index / select: an inline "
                          "sample is its own prompt; expected one of them")
    if not s.prompt:
        raise ConfigError("config key 'polymath.sample.prompt' is empty: expected the sample's prompt text")
