"""Text environments with GEM's protocol (arXiv 2510.01051), for the multi-turn rollout source.

    env.reset(seed) -> (observation: str, info: dict)
    env.step(action_text) -> (observation, reward, terminated, truncated, info)

`make_env(id, **kwargs)` resolves an id: `credo:<Name>` is a built-in env of this package (no extra
packages), `<prefix>:<id>` with a prefix of ADAPTERS wraps another package's env (`shopsim:<id>`: the real
ShopSimulator, a ConfigError naming the install when it is absent), anything else is handed to `gem.make`
(e.g. `game:GuessTheNumber-v0-easy`, `rg:chain_sum`; `pip install 'credo[envs]'`). An unknown id is a `ConfigError` that lists close ids.
"""

from __future__ import annotations

import difflib
import functools
import logging
from typing import Any, Callable

from credo.config import ConfigError
from credo.families.multiturn.envs.guess import GuessNumberEnv
from credo.families.multiturn.envs.mastermind import MastermindEnv
from credo.families.multiturn.envs.shop import SHOP_ENVS, shopsim_env
from credo.families.multiturn.envs.vault import VaultEnv

BUILTIN_ENVS: dict[str, Callable[..., Any]] = {"credo:GuessNumber-v0": GuessNumberEnv, "credo:Mastermind-v0": MastermindEnv,
                                               "credo:Vault-v0": VaultEnv, **SHOP_ENVS}
ADAPTERS: dict[str, Callable[[str], Callable[..., Any]]] = {"shopsim:": shopsim_env}
"""id prefix -> a function of the whole id giving the env's constructor; it raises a ConfigError when the package
behind the adapter is not installed (so `credo check` says so before any warm-up)."""


def builtin_constructor(env_id: str) -> Callable[..., Any] | None:
    """The constructor of a built-in or adapter id, or None for an id that goes to gem."""
    for prefix, adapter in ADAPTERS.items():
        if env_id.startswith(prefix):
            return adapter(env_id)
    return BUILTIN_ENVS.get(env_id)


def gem_ids() -> list[str]:
    """The ids gem registers (imports gem; a ConfigError when it is not installed)."""
    try:
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        import gem  # noqa: F401  (its import calls logging.basicConfig(level=INFO): undone below)
        from gem.envs.registration import ENV_REGISTRY
        root.setLevel(level)
        root.handlers[:] = handlers
    except ImportError:
        raise ConfigError("config key 'env.id' names a GEM env, which needs gem-llm: pip install 'credo[envs]'") from None
    return sorted(ENV_REGISTRY)


def check_env_id(env_id: str) -> None:
    """`env_id` is a built-in or registered GEM id, else a ConfigError naming close ids."""
    if builtin_constructor(env_id) is not None:  # adapter ids (shopsim:) never reach gem
        return
    known = list(BUILTIN_ENVS) if env_id.startswith("credo:") else gem_ids()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, sorted(set(known) | set(BUILTIN_ENVS)), n=5, cutoff=0.5)
        hint = f"; close ids: {', '.join(close)}" if close else ""
        raise ConfigError(f"config key 'env.id' = '{env_id}' is not a known environment{hint} "
                          f"(built-in: {', '.join(BUILTIN_ENVS)}; GEM ids such as 'game:GuessTheNumber-v0-easy')")


def env_class(env_id: str):
    """The class `make_env(env_id)` instantiates (a built-in's, or the one GEM's registry names)."""
    constructor = builtin_constructor(env_id)
    while isinstance(constructor, functools.partial):  # a preset (the shop's levels): the class it binds
        constructor = constructor.func
    if constructor is not None:
        return constructor
    gem_ids()  # imports gem, quietly
    import importlib

    from gem.envs.registration import ENV_REGISTRY

    entry = ENV_REGISTRY[env_id].entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        return getattr(importlib.import_module(module), name)
    return entry


def check_env_kwargs(env_id: str, kwargs: dict) -> None:
    """Each key of env.kwargs is a setting the env's constructor honours. GEM passes unknown keys to a constructor
    that swallows them (`**_`), so a misspelt or foreign key would be dropped without a word."""
    import inspect

    try:
        params = inspect.signature(env_class(env_id).__init__).parameters
    except (TypeError, ValueError):  # no signature to read: trust it
        return
    named = [n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    passes_on = any(p.kind is p.VAR_KEYWORD and not p.name.startswith("_") for p in params.values())
    for key in kwargs:
        if key not in named and not passes_on:
            close = difflib.get_close_matches(str(key), named, n=1, cutoff=0.5)
            hint = f"; did you mean 'env.kwargs.{close[0]}'?" if close else ""
            raise ConfigError(f"config key 'env.kwargs.{key}' is not a setting of '{env_id}' (its settings: "
                              f"{', '.join(named) or 'none'}){hint}")


def make_env(env_id: str, **kwargs):
    """A fresh environment for `env_id` with constructor overrides `kwargs` (GEM merges them over its defaults)."""
    check_env_id(env_id)
    constructor = builtin_constructor(env_id)
    if constructor is not None:
        try:
            return constructor(**kwargs)
        except ConfigError:  # the env's own check, naming its setting
            raise
        except (TypeError, ValueError) as e:  # a setting of the wrong kind ('abc' where a number goes)
            raise ConfigError(f"config key 'env.kwargs' for '{env_id}': {e}") from None
    import gem

    return gem.make(env_id, **kwargs)
