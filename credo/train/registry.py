"""Stage registry: the names a recipe's `stages:` section may use, read by the builder and `credo check` only.

`default` names the built-in stage of each kind (the task's single-turn prompts, the function reward,
the outcome estimator `algo.advantage`); families that add stages register them here.

A stage is named either by a registered name or by an import spec `package.module:factory`, so a
researcher adds a rollout source, reward model, advantage stage or probe in their own file and names it
in a recipe without editing credo. A factory is called as

    factory(ctx: StageContext, **kwargs) -> stage

where `kwargs` are the recipe's `stages.<kind>_kwargs` and `ctx` holds what the builder has already
built (tokenizer, task, engines, the default stage of that kind, ...). Built-in stages register here
with `register_stage`; this module imports nothing heavy, so `credo check` can resolve names quickly.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from credo.config import ConfigError

KINDS = ("rollout", "reward", "advantage", "probe")
STAGES: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}


def register_stage(kind: str, name: str):
    """Decorator: register `factory(ctx, **kwargs)` as the stage `name` of `kind`."""
    if kind not in STAGES:
        raise ValueError(f"unknown stage kind '{kind}' (known: {', '.join(KINDS)})")

    def deco(factory: Callable) -> Callable:
        if name in STAGES[kind]:
            raise ValueError(f"{kind} stage '{name}' is already registered")
        STAGES[kind][name] = factory
        return factory

    return deco


@dataclass
class StageContext:
    """What a stage factory may use; filled by the builder as it goes."""

    rank: int
    world: int
    seed: int
    tokenizer: Any = None
    task: Any = None
    backend: Any = None
    """The rollout engine (hf or vllm): `generate(prompts, max_new_tokens=, temperature=, top_p=, seeds=)`."""
    engine: Any = None
    """The policy's DeepSpeed engine (`engine.module` is the model)."""
    rollout: dict = field(default_factory=dict)
    """The recipe's sampling settings: prompts_per_step, group_size, max_new_tokens, temperature, top_p."""
    render: Any = None
    """`render(problem) -> str`: the recipe's prompt rendering (chat template, system prompt), as the default stages use."""
    default: Any = None
    """The built-in stage of the kind being built (a plug-in may wrap it)."""
    env: Any = None
    """The recipe's env: section (`credo.config.EnvConfig`), for multi-turn sources."""
    judge: Any = None
    """The recipe's `judge:` section (JudgeConfig), for judge reward stages."""
    task_config: Any = None
    """The recipe's `task:` section (what a judge warm-up builds its judging task from)."""
    reward_isolation: dict = field(default_factory=dict)
    """reward.timeout_s, reward.workers and reward.max_failure_frac."""


DEFAULT = "default"

LAZY_BUILTINS: dict[str, dict[str, str]] = {
    "probe": {"attention_credit": "credo.train.attention_probe"},
    "rollout": {"multiturn": "credo.train.multiturn", "ce_rm_two_stage": "credo.train.ce_rm"},
    "reward": {"env": "credo.train.multiturn", "judge": "credo.train.judge_reward", "rm_nlhf": "credo.train.rm_nlhf",
               "ce_rm": "credo.train.ce_rm"},
    "advantage": {"turn_credit": "credo.train.turn_credit"},
}
"""Built-in stages whose module registers them on import; imported on first lookup so this one stays light."""


def resolve(kind: str, spec: str, key: str) -> Callable | None:
    """The factory `spec` names: None for 'default' (the builder's built-in), a registered name, or
    'package.module:attr'. Errors name the recipe key."""
    if spec == DEFAULT:
        return None
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"config key '{key}' = '{spec}': cannot import module '{module}' ({e})") from None
        if not hasattr(obj, attr) or not callable(getattr(obj, attr)):
            raise ConfigError(f"config key '{key}' = '{spec}': module '{module}' has no callable '{attr}'")
        return getattr(obj, attr)
    known = STAGES[kind]
    if spec not in known and spec in LAZY_BUILTINS.get(kind, {}):
        importlib.import_module(LAZY_BUILTINS[kind][spec])
    if spec not in known:
        names = sorted(set(known) | set(LAZY_BUILTINS.get(kind, {})))
        close = difflib.get_close_matches(spec, names, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key '{key}' = '{spec}' is not a known {kind} stage{hint} "
                          f"(known: {', '.join(names) or 'none'}; or give 'package.module:factory')")
    return known[spec]



def check_stages(stages) -> None:
    """Resolve every stage a recipe names (`credo check` time): unknown names and failed imports are errors."""
    for kind in ("rollout", "reward", "advantage"):
        factory = resolve(kind, getattr(stages, kind), f"stages.{kind}")
        kwargs = getattr(stages, f"{kind}_kwargs")
        if factory is None and kwargs:
            raise ConfigError(f"config key 'stages.{kind}_kwargs' is set but stages.{kind} is 'default', whose settings "
                              "live in their own sections; name the stage they are for")
        if factory is not None and kwargs:
            _check_factory_kwargs(factory, kwargs, f"stages.{kind}_kwargs")
    for i, spec in enumerate(stages.probes):
        if not isinstance(spec, str):
            raise ConfigError(f"config key 'stages.probes[{i}]' = {spec!r}: expected a name or 'package.module:factory'")
        if resolve("probe", spec, f"stages.probes[{i}]") is None:
            raise ConfigError(f"config key 'stages.probes[{i}]': there is no default probe; name one")
    for spec in stages.probe_kwargs:
        if spec not in stages.probes:
            raise ConfigError(f"config key 'stages.probe_kwargs.{spec}' names no entry of stages.probes ({stages.probes})")


def _check_factory_kwargs(factory: Callable, kwargs: dict, key: str) -> None:
    """Each key of `kwargs` is a keyword `factory(ctx, ...)` takes (a factory with **kwargs takes any)."""
    import inspect

    params = list(inspect.signature(factory).parameters.values())[1:]  # the first is ctx
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    valid = sorted(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    for k in kwargs:
        if k not in valid:
            close = difflib.get_close_matches(str(k), valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}.{k}'{hint} (valid: {', '.join(valid) or 'none'})")
