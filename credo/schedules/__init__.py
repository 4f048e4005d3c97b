"""Rollout schedules: when the rollout source runs relative to the update, as parts (`stages.schedule`).

    sync           every sample of step k comes from the weights after step k-1 (the default)
    tail_batching  RollPacker's short and long rounds (arXiv 2509.21009): short rounds race extra prompts and
                   responses, the losers wait for a long round (`credo.schedules.tail_batching`)
    fixed_lag      step k trains on the batch sampled S versions earlier, in this process, deterministically
                   (`credo.schedules.fixed_lag`)
    overlap        rollout worker processes generate up to S versions ahead while the trainer trains (ROLL Flash,
                   arXiv 2510.11345; `credo.schedules.overlap`)

A recipe picks one with `stages.schedule` and sets it with `stages.schedule_kwargs` (strict: an unknown key is an
error naming it). Each schedule lives in its own module, which declares a `SCHEDULE` (`Schedule` below): its
settings dataclass, what it needs of the rollout source, the backend and the engine (`credo.capabilities`), and
`wrap(source, runtime, settings) -> source`, which schedules any source that provides what it needs. The run plan
(`credo.plan`) resolves the schedule once and checks its needs before any warm-up.

The old keys (`rollout.tail_batching`, `rollout.max_staleness` with `rollout.async_mode` and the other
`rollout.async_*` keys) keep working for one release: `schedule_of` maps them onto the schedule, with a warning
naming the new key. This module imports nothing heavy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any, Callable

from credo.errors import ConfigError

BUILTIN = ("sync", "tail_batching", "fixed_lag", "overlap")
"""The built-in schedules, each the module credo.schedules.<name> with a `SCHEDULE`."""


@dataclass(frozen=True)
class Schedule:
    """One schedule's declaration (its module's `SCHEDULE`)."""

    name: str
    """The value of stages.schedule."""
    doc: str
    """One line: what it does, with its paper's arXiv id."""
    settings: type
    """Dataclass of stages.schedule_kwargs (fields with one-line docs and ranges)."""
    wrap: Callable[[Any, Any, Any], Any]
    """wrap(source, runtime, settings) -> the scheduled source (same protocol: rollout, sync, state_dict, close)."""
    source_needs: frozenset = frozenset()
    """Capabilities the rollout source must provide (`credo.capabilities`)."""
    backend_needs: frozenset = frozenset()
    """Capabilities the rollout backend must provide."""
    engine_needs: frozenset = frozenset()
    """Capabilities the training engine must provide."""
    staleness: Callable[[Any], int] = lambda s: 0
    """The most policy versions a trained sample may lag (0: on-policy); the scorer then recomputes pi_old."""
    check: Callable[[Any, Any, str], None] | None = None
    """check(recipe, settings, key): its settings against the rest of the recipe; raises ConfigError naming the key."""


def schedule(name: str) -> Schedule:
    """The built-in schedule `name` (its module imported now)."""
    if name not in BUILTIN:
        from credo.family import close_names

        raise ConfigError(f"config key 'stages.schedule' = '{name}' is not a known schedule{close_names(name, list(BUILTIN))}"
                          f" (known: {', '.join(BUILTIN)})")
    found = importlib.import_module(f"credo.schedules.{name}").SCHEDULE
    if not isinstance(found, Schedule):
        raise TypeError(f"credo.schedules.{name}.SCHEDULE is a {type(found).__name__}, expected a Schedule")
    return found


OLD_OVERLAP_KEYS = {"stale_policy": "stale_policy", "async_workers": "workers",
                    "prompt_replication": "prompt_replication", "async_request_prompts": "request_prompts",
                    "async_timeout_s": "timeout_s"}
"""rollout.<old key> -> its overlap setting (stages.schedule_kwargs.<new key>)."""


def _old_keys_set(r) -> list[str]:
    """The deprecated rollout.* schedule keys this recipe sets to something other than their default."""
    from credo.config import RolloutConfig

    ro, default = r.rollout, RolloutConfig()
    names = ["tail_batching", "max_staleness", "async_mode", *OLD_OVERLAP_KEYS]
    return [f"rollout.{n}" for n in names if getattr(ro, n) != getattr(default, n)]


def schedule_of(r) -> tuple[str, dict, str, list[str]]:
    """(schedule name, its kwargs, the key its kwargs are read from, warnings) for recipe `r`: stages.schedule and
    stages.schedule_kwargs, or the deprecated rollout.* keys mapped onto them. The one place either is read."""
    st, ro = r.stages, r.rollout
    old = _old_keys_set(r)
    if st.schedule != "sync" or st.schedule_kwargs:
        if old:
            raise ConfigError(f"config keys 'stages.schedule' = '{st.schedule}' and '{old[0]}' are both set: "
                              f"{old[0]} is the deprecated spelling of a schedule; expected only stages.schedule and "
                              "stages.schedule_kwargs")
        return st.schedule, dict(st.schedule_kwargs), "stages.schedule_kwargs", []
    if not old:
        return "sync", {}, "stages.schedule_kwargs", []
    if ro.tail_batching is not None:
        if ro.max_staleness > 0:
            raise ConfigError("config keys 'rollout.tail_batching' and 'rollout.max_staleness' are both set: tail "
                              "batching is a synchronous, on-policy schedule; expected one schedule (stages.schedule)")
        kwargs = {f.name: getattr(ro.tail_batching, f.name) for f in fields(ro.tail_batching)}
        return "tail_batching", kwargs, "rollout.tail_batching", [_deprecated("rollout.tail_batching", "tail_batching")]
    if ro.max_staleness == 0:  # async keys without a staleness bound: the run is synchronous; say so (issue 57 A.4)
        return "sync", {}, "stages.schedule_kwargs", [
            f"warning: {', '.join(old)} {'is' if len(old) == 1 else 'are'} set but rollout.max_staleness is 0, so the "
            "run is synchronous; for asynchronous training set stages.schedule: overlap (or fixed_lag) with "
            "stages.schedule_kwargs: {max_staleness: 1}"]
    kwargs = {"max_staleness": ro.max_staleness}
    if ro.async_mode == "overlap":
        kwargs.update({new: getattr(ro, o) for o, new in OLD_OVERLAP_KEYS.items()})
    else:
        ignored = [f"rollout.{o}" for o in OLD_OVERLAP_KEYS if f"rollout.{o}" in old]
        if ignored:
            raise ConfigError(f"config key '{ignored[0]}' is an overlap setting, but rollout.async_mode is "
                              "'fixed_lag'; expected rollout.async_mode: overlap (stages.schedule: overlap)")
    return ro.async_mode, kwargs, "rollout.max_staleness", [_deprecated("rollout.max_staleness / rollout.async_mode",
                                                                         ro.async_mode)]


def _deprecated(old: str, name: str) -> str:
    return (f"warning: {old} is deprecated and will be removed in the next release: use stages.schedule: {name} "
            f"with its settings in stages.schedule_kwargs (docs/schedules.md)")
