"""Stage resolution: the names a recipe's `stages:` section may use, read by the builder and `credo check` only.

A stage is named by
- `default`: the builder's built-in of that kind (the task's single-turn prompts, the function reward, the
  outcome estimator `algo.advantage`), or the stage an active family puts in its place (`credo.family`);
- a name a family declares in its table (`multiturn`, `judge`, `turn_credit`, `attention_credit`, ...);
- a name registered in code with `register_stage(kind, name)`;
- an import spec `package.module:factory`, so a researcher adds a stage in their own file without editing credo.

`resolve` is called only by the run plan (`credo.plan.resolve_plan`), once per stage. A factory is called as `factory(ctx, settings)` when its family declares a settings dataclass for it (the
recipe's `stages.<kind>_kwargs`, checked field by field at `credo check`, before any warm-up), else as
`factory(ctx, **kwargs)` with the kwargs checked against its signature. `ctx` is a `StageContext`: what the
builder has already built. This module imports nothing heavy, so `credo check` resolves names quickly.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from credo.errors import ConfigError
from credo.family import KINDS, Family, StageEntry, import_spec, stage_entry, stage_names

STAGES: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}
"""Stages registered in code (`register_stage`); families declare theirs in their tables instead."""

DEFAULT = "default"


def register_stage(kind: str, name: str):
    """Decorator: register `factory(ctx, **kwargs)` as the stage `name` of `kind`."""
    if kind not in STAGES:
        raise ValueError(f"unknown stage kind '{kind}' (known: {', '.join(KINDS)})")

    def deco(factory: Callable) -> Callable:
        if name in STAGES[kind] and STAGES[kind][name] is not factory:
            raise ValueError(f"{kind} stage '{name}' is already registered")
        STAGES[kind][name] = factory
        return factory

    return deco


@dataclass(frozen=True)
class StageContext:
    """What a stage factory may use: the run's runtime, frozen, and the recipe it runs. The builder makes a new one
    (`dataclasses.replace`) as it goes (with the source, then the scorer) and for each factory call (with that call's
    `default` and `section`), so no factory sees another's per-call values and none can change what the next one gets.

    Run-wide settings (the seed, the sampling settings, model.dtype, ...) are properties read from `recipe`, here and
    nowhere else, not fields: a context cannot hold a value that disagrees with the recipe it runs."""

    rank: int = 0
    world: int = 1
    recipe: Any = None
    """The whole recipe, read-only (None: the default recipe). A family stage or hook reads its own section through
    `section`; this is for one that also reads another family's section (a source that plays the environment another
    family's section describes) and for the run-wide properties below."""
    tokenizer: Any = None
    task: Any = None
    backend: Any = None
    """The rollout engine (hf, vllm or the Ray pool): `generate(prompts, max_new_tokens=, temperature=, top_p=, seeds=)`."""
    engine: Any = None
    """The policy's training engine (`engine.module` is the model)."""
    render: Any = None
    """`render(problem) -> str`: the recipe's prompt rendering (chat template, system prompt), as the default stages use."""
    policy_path: str | None = None
    """The folder the policy was loaded from (the warm-up's output, or model.path)."""
    ref_model: Any = None
    """The frozen reference policy (model.ref_model), or None."""
    scorer: Any = None
    """The PolicyScorer (built before the advantage stage)."""
    source: Any = None
    """The rollout source (built before every other stage)."""
    cluster: Any = None
    """The run's Ray parts (`credo.train.cluster.Cluster`: `track`, `check_role`, `cfg`) with cluster.engine: ray;
    None with the local engine. A family that moves work onto Ray workers builds them through it."""
    default: Any = None
    """Per call: the built-in stage of the kind being built (a plug-in may wrap it); None where there is none."""
    section: Any = None
    """Per call: the recipe section of the family whose stage is being built (e.g. `env:` for `multiturn`)."""

    def __post_init__(self):
        if self.recipe is None:
            from credo.config import Recipe

            object.__setattr__(self, "recipe", Recipe())

    @property
    def seed(self) -> int:
        """run.seed."""
        return self.recipe.run.seed

    @property
    def rollout(self) -> dict:
        """The sampling settings every rollout source takes: prompts_per_step, group_size, max_new_tokens,
        temperature, top_p, and the truncation keys that are set (top_k, min_p, kept_set_replay)."""
        from credo.config.truncation import truncation_kwargs

        ro = self.recipe.rollout
        return dict(prompts_per_step=ro.prompts_per_step, group_size=ro.group_size, max_new_tokens=ro.max_new_tokens,
                    temperature=ro.temperature, top_p=ro.top_p, **truncation_kwargs(ro))

    @property
    def task_config(self) -> Any:
        """The recipe's `task:` section (what a judge warm-up builds its judging task from)."""
        return self.recipe.task

    @property
    def reward_isolation(self) -> dict:
        """reward.timeout_s, reward.workers and reward.max_failure_frac."""
        rw = self.recipe.reward
        return dict(timeout_s=rw.timeout_s, workers=rw.workers, max_failure_frac=rw.max_failure_frac)

    @property
    def dtype(self) -> str:
        """model.dtype."""
        return self.recipe.model.dtype

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage of the policy's engine (a stage with engines of its own uses the same)."""
        return self.recipe.optim.zero_stage

    @property
    def advantage_kwargs(self) -> dict:
        """algo.advantage_kwargs (GAE's gamma and lam for the critic stage)."""
        return dict(self.recipe.algo.advantage_kwargs)

    @property
    def eval_samples(self) -> int:
        """run.eval_samples: an evaluator's draws per held-out problem."""
        return self.recipe.run.eval_samples


@dataclass(frozen=True)
class Resolved:
    """A stage name resolved: its factory, its settings dataclass (or None), the family that declares it, and its
    declared capabilities (`credo.capabilities`; a registered or imported factory declares them as attributes
    `provides` / `backend_needs`, default none)."""

    factory: Callable
    settings: type | None = None
    family: Family | None = None
    provides: frozenset = frozenset()
    backend_needs: frozenset = frozenset()


def resolve(kind: str, spec: str, key: str, families: tuple[Family, ...] = ()) -> Resolved | None:
    """What `spec` names: None for 'default', else the factory (a family's, a registered one, or
    'package.module:attr'). Errors name the recipe key."""
    if spec == DEFAULT:
        return None
    if ":" in spec:
        module, _, attr = spec.partition(":")
        obj = None
        try:
            obj = import_spec(spec, key)
        except ConfigError as e:
            if "has no attribute" not in str(e):
                raise
        if not callable(obj):
            raise ConfigError(f"config key '{key}' = '{spec}': module '{module}' has no callable '{attr}'")
        return _declared(obj)
    found = stage_entry(families, kind, spec)
    if found is not None:
        fam, entry = found
        return Resolved(import_spec(entry.factory, key), entry.settings, fam, entry.provides, entry.backend_needs)
    if spec in STAGES[kind]:
        return _declared(STAGES[kind][spec])
    names = sorted(set(STAGES[kind]) | set(stage_names(families, kind)))
    close = difflib.get_close_matches(spec, names, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"config key '{key}' = '{spec}' is not a known {kind} stage{hint} "
                      f"(known: {', '.join(names) or 'none'}; or give 'package.module:factory')")


def _declared(factory: Callable) -> Resolved:
    return Resolved(factory, provides=frozenset(getattr(factory, "provides", ())),
                    backend_needs=frozenset(getattr(factory, "backend_needs", ())))


def settings_of(resolved: Resolved, kwargs: dict, key: str) -> Any:
    """The stage's settings from the recipe's kwargs: a dataclass instance built strictly (unknown keys, types,
    ranges, its own `check`), or the kwargs themselves checked against the factory's signature."""
    if resolved.settings is None:
        _check_factory_kwargs(resolved.factory, kwargs, key)
        return dict(kwargs)
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    from credo.config import check_fields

    cls = resolved.settings
    try:
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(dict(kwargs))))
    except ConfigKeyError as e:
        valid = sorted(f for f in cls.__dataclass_fields__)
        bad = str(e.full_key)
        close = difflib.get_close_matches(bad, valid, n=1, cutoff=0.5)
        hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
        raise ConfigError(f"unknown config key '{key}.{bad}'{hint} (valid: {', '.join(valid)})") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"config key '{key}.{e.full_key}': {str(e).splitlines()[0]}") from None
    check_fields(settings, key)
    if hasattr(settings, "check"):
        settings.check(key)
    return settings


def stage_settings(cls: type, given: Any, kwargs: dict, key: str) -> Any:
    """For a factory called directly: its settings object `given`, or one built strictly from `kwargs` (the way a
    recipe's `stages.<kind>_kwargs` are), so `factory(ctx, gamma=0.9)` and `factory(ctx, settings)` agree."""
    if given is not None:
        if kwargs:
            raise TypeError(f"pass either a {cls.__name__} or keyword settings, not both")
        return given
    return settings_of(Resolved(lambda ctx: None, cls), kwargs, key)


def build_stage(resolved: Resolved, ctx: StageContext, settings: Any):
    """Call the factory the way its declaration asks (a settings object, or keyword arguments)."""
    if resolved.settings is None:
        return resolved.factory(ctx, **settings)
    return resolved.factory(ctx, settings)


def check_factory_call(factory: Callable, kwargs: dict, key: str, spec: str, settings_key: str) -> None:
    """`factory(ctx, **kwargs)` can be called: no required argument past ctx left unset, none too many.

    A function that is not a factory (a reward function named as `stages.advantage`, say) passed `credo check` and
    failed as the run bound its stages, after the warm-up, with a TypeError traceback raised at credo's call site,
    so not recognised as the user's (issue 57's round-4 trial). Unknown keyword names are `_check_factory_kwargs`'s.
    """
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: trust it
        return
    try:
        sig.bind(object(), **kwargs)
    except TypeError as e:
        call = f"fn(ctx, **{settings_key})" if kwargs else "fn(ctx)"
        raise ConfigError(f"config key '{key}' = '{spec}' has the signature {sig}, which cannot be called as a stage "
                          f"factory {call} ({e}); expected fn(ctx, **settings) returning the stage "
                          "(docs/architecture.md)") from None


def _check_factory_kwargs(factory: Callable, kwargs: dict, key: str) -> None:
    """Each key of `kwargs` is a keyword `factory(ctx, ...)` takes (a factory with **kwargs takes any)."""
    params = list(inspect.signature(factory).parameters.values())[1:]  # the first is ctx
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    valid = sorted(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    for k in kwargs:
        if k not in valid:
            close = difflib.get_close_matches(str(k), valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}.{k}'{hint} (valid: {', '.join(valid) or 'none'})")


__all__ = ["DEFAULT", "KINDS", "STAGES", "Resolved", "StageContext", "StageEntry", "build_stage",
           "register_stage", "resolve", "settings_of", "stage_settings"]
