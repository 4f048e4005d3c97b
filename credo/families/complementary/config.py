"""The Complementary RL family's recipe section (`complementary:`) and its load-time checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from credo.config import checked, one_of, out_of_range, ranged
from credo.capabilities import Refusal
from credo.errors import ConfigError

EXTRACTORS = ("model", "frozen", "none", "self")


@dataclass
class ComplementaryConfig:
    extractor: str = one_of("model", EXTRACTORS)
    """model: a second model, trained with its own optimizer on the paired-gain reward (Complementary RL);
    frozen: the same extractor after its warm-up, never trained (a static-extractor bank, the paper's baseline);
    none: no extractor and no bank (outcome-only RL on the same source: the other baseline);
    self: one model, the actor is its own extractor: it writes the lessons from the extractor's prompt, and its lesson
    samples join its own update with their paired gains as rewards, in groups of their own (one optimizer).
    The extractor_* keys of a second model (extractor_path other than 'actor', extractor_lr, weight decay, clip) do
    not apply; extractor_sft_* is the actor's lesson warm-up, mixed with its own game demonstrations."""
    extractor_path: str = "actor"
    """The extractor's initial weights: 'actor' (a copy of the actor after its warm-up), 'tiny' (the recipe's tiny
    model, fresh), a model folder or a hub id; it must share the actor's tokenizer."""
    extractor_lr: float = ranged(1.0e-3, gt=0)
    """The extractor's AdamW learning rate (its own optimizer)."""
    extractor_weight_decay: float = ranged(0.0, ge=0)
    """The extractor's AdamW weight decay."""
    extractor_grad_clip: float = ranged(1.0, gt=0)
    """The extractor's gradient-norm clip."""
    extractor_sft_steps: int = ranged(100, ge=0)
    """Warm-up steps of the extractor on scripted lessons (the env's `scripted_lesson`; 0 = none)."""
    extractor_sft_lr: float = ranged(3.0e-3, gt=0)
    """Learning rate of the extractor's warm-up."""
    extractor_sft_batch: int = ranged(32, ge=1)
    """Scripted (trajectory, lesson) pairs per warm-up step."""
    extractor_demo_noise: float = ranged(0.3, ge=0, le=1)
    """Probability that a warm-up lesson is a random code instead of the scripted one (leaves RL room)."""
    extract_per_step: int = ranged(2, ge=1)
    """Finished actor episodes (each of another game) the extractor distils per step."""
    candidates: int = ranged(4, ge=2)
    """Lessons the extractor samples per distilled episode: its GRPO group."""
    paired_episodes: int = ranged(4, ge=1)
    """Paired actor episodes per candidate (and per baseline arm) that measure its gain."""
    lesson_tokens: int = ranged(8, ge=1)
    """Generation cap of one lesson."""
    extractor_temperature: float = ranged(1.0, gt=0)
    """Sampling temperature of the extractor's lessons."""
    experience_frac: float = ranged(0.5, ge=0, le=1)
    """Fraction of each game's G actor episodes shown the retrieved lesson (the rest see none; both halves give the
    with-minus-without measure of each entry)."""
    conditional_groups: bool = True
    """Conditional advantage estimation: group ids per (game, shown entry id and version); false = per game."""
    retrieval: str = one_of("task", ("task", "similarity"))
    """task: the entry of the episode's task id (the env's task_id(seed), else its first observation);
    similarity: the entry whose key's hashed n-gram embedding is closest by cosine (>= similarity_threshold)."""
    similarity_threshold: float = ranged(0.9, ge=-1, le=1)
    """Least cosine similarity for a retrieval by similarity."""
    add_min: float = ranged(0.0, ge=-1)
    """A candidate enters the bank (add, or replaces the entry) only with a paired gain above this."""
    delete_below: float = ranged(0.0, ge=-2, le=2)
    """An entry whose running help falls below this after min_uses measurements is deleted."""
    min_uses: int = ranged(4, ge=1)
    """Measurements before an entry can be deleted for not helping."""
    capacity: int = ranged(64, ge=1)
    """Most entries the bank keeps (the lowest-scored go first)."""
    inject_in_eval: bool = True
    """eval/return plays the held-out episodes with the bank's lessons (the deployed actor); false = without."""
    extractor_async: bool = False
    """The extractor's step (observe, distil, pair, train, consolidate) of step k runs in a worker thread beside the
    actor's step k+1 (beside.py), on a copy of the bank and a copy of the actor's weights after step k; its bank is
    installed after step k+1, so the actor is shown a bank exactly one step older (complementary/bank_lag) and the
    extractor/* and bank/* metrics of step k+1 describe the work on step k's batch. Only with extractor: model or
    frozen, the hf backend and rollout.max_staleness: 0. false = the synchronous hook after the sync."""


def check_complementary(r) -> None:
    c, on = r.complementary, r.stages.rollout == "complementary"
    note_frac = dict(r.env.kwargs).get("note_frac", 0) if r.env.id else 0
    if note_frac and not on:
        raise ConfigError(f"config key 'env.kwargs.note_frac' = {note_frac} pins true notes on the env's resets, which "
                          f"would leak the answer into a '{r.stages.rollout}' run's training: expected "
                          "stages.rollout: complementary (which pins its own notes) or note_frac: 0")
    if not on:
        return
    if not r.env.id:
        raise ConfigError("config key 'stages.rollout' = 'complementary' plays a multi-turn env: set env.id "
                          "(e.g. 'credo:Vault-v0')")
    if r.env.init_resample_frac > 0:
        raise out_of_range("env.init_resample_frac", r.env.init_resample_frac,
                           "0 with stages.rollout: complementary (its prompts carry lessons, not expert prefixes)")
    if c.extractor != "none" and not 0 < c.experience_frac:
        raise out_of_range("complementary.experience_frac", c.experience_frac,
                           f"> 0 with complementary.extractor: {c.extractor} (no episode would see a lesson)")
    if c.conditional_groups and r.stages.advantage == "turn_credit" and \
            r.stages.advantage_kwargs.get("credit", "mc_rebn") != "grpo":
        raise ConfigError("config key 'complementary.conditional_groups' is on but stages.advantage_kwargs.credit is "
                          f"'{r.stages.advantage_kwargs.get('credit', 'mc_rebn')}', which ignores groups: expected "
                          "credit: grpo (or complementary.conditional_groups: false)")
    if c.extractor == "self":
        check_one_model(r)
    if c.extractor_async:
        check_async(r)
    if c.lesson_tokens >= r.env.max_total_tokens:
        raise out_of_range("complementary.lesson_tokens", c.lesson_tokens,
                           f"< env.max_total_tokens ({r.env.max_total_tokens})")


def check_one_model(r) -> None:
    """`complementary.extractor: self` puts lesson samples into the actor's batch with their own rewards and group
    ids: only trajectory GRPO gives them an advantage from their own group; there is no second model to load."""
    c, credit = r.complementary, r.stages.advantage_kwargs.get("credit", "mc_rebn")
    if r.stages.advantage != "turn_credit" or credit != "grpo":
        raise ConfigError(f"config key 'complementary.extractor' = 'self' puts lesson samples in the actor's batch, "
                          f"each normalised among the candidates of its episode: expected stages.advantage: "
                          f"turn_credit with stages.advantage_kwargs.credit: grpo, got stages.advantage: "
                          f"'{r.stages.advantage}' with credit '{credit}'")
    if c.extractor_path != "actor":
        raise ConfigError(f"config key 'complementary.extractor_path' = '{c.extractor_path}': with "
                          "complementary.extractor: self the actor is the extractor (no second model to load): "
                          "expected 'actor'")


def check_async(r) -> None:
    """complementary.extractor_async: the work it moves is the second model's (the one-model mode's lessons are
    sampled inside the rollout); its worker samples the paired episodes with the hf backend on its own copy of the
    actor; a second lag on top of an asynchronous schedule is not built (a row in `REFUSALS`)."""
    c = r.complementary
    if c.extractor not in ("model", "frozen"):
        raise ConfigError(f"config key 'complementary.extractor_async' = true needs a second model to run beside the "
                          f"actor: expected complementary.extractor: model or frozen, got '{c.extractor}' (or "
                          "complementary.extractor_async: false)")
    if r.rollout.backend != "hf":
        raise ConfigError(f"config key 'complementary.extractor_async' = true plays its paired episodes with the hf "
                          f"backend on a copy of the actor: expected rollout.backend: hf, got '{r.rollout.backend}' "
                          "(or complementary.extractor_async: false)")


REFUSALS = (
    Refusal(("complementary.extractor_async", "stages.schedule"),
            lambda r, p: r.complementary.extractor_async and p.schedule.staleness > 0,
            "a bank lag on top of a rollout lag is not built; expected a synchronous schedule "
            "(or complementary.extractor_async: false)"),
)
"""Combinations the complementary family cannot run in (checked by the run plan with every other row)."""
