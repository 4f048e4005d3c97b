"""Checks of truncated sampling (`rollout.top_k`, `rollout.top_p`, `rollout.min_p`, `rollout.kept_set_replay`): the
settings the rollout paths that support them can serve, each error naming the key (docs/truncated_sampling.md)."""

from __future__ import annotations

from credo.errors import ConfigError


def truncates(ro) -> bool:
    """Whether the rollout section's sampler cuts the vocabulary (top-p < 1, top-k or min-p)."""
    return ro.top_p < 1 or ro.top_k > 0 or ro.min_p > 0


def check_truncation(r) -> None:
    """top_k / min_p and kept-set replay run on the default rollout source, synchronously or with fixed_lag, on the hf
    backend, vLLM and the Ray pool; families' own sources do not pass them (refused here), nor do tail batching's race
    and overlap's workers (refused by the run plan)."""
    ro = r.rollout
    new_keys = [k for k, on in (("rollout.top_k", ro.top_k > 0), ("rollout.min_p", ro.min_p > 0)) if on]
    if ro.kept_set_replay and truncates(ro):
        new_keys.append("rollout.kept_set_replay")
    if not new_keys:
        return
    key = new_keys[0]
    if r.stages.rollout != "default":
        raise ConfigError(f"config keys '{key}' and 'stages.rollout' = '{r.stages.rollout}' cannot be used together: "
                          "only the default rollout source passes top_k, min_p and kept sets to the engine; expected "
                          "stages.rollout: default")
    # with a schedule that does not pass them (tail batching's race, overlap's workers): a refusal row of the run
    # plan (credo.capabilities.CORE_REFUSALS), which reads the schedule however the recipe spells it


def truncation_kwargs(ro) -> dict:
    """The rollout source's keywords for truncated sampling, only those set (an empty dict leaves every source, and
    the stages that read `StageContext.rollout`, as they were): top_k, min_p, kept_set_replay."""
    out = {k: v for k, v in (("top_k", ro.top_k), ("min_p", ro.min_p)) if v}
    if ro.kept_set_replay and truncates(ro):
        out["kept_set_replay"] = True
    return out
