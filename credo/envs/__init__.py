"""Text environments with GEM's protocol (arXiv 2510.01051), for the multi-turn rollout source.

    env.reset(seed) -> (observation: str, info: dict)
    env.step(action_text) -> (observation, reward, terminated, truncated, info)

`make_env(id, **kwargs)` resolves an id: `credo:<Name>` is a built-in env of this package (no extra
packages), anything else is handed to `gem.make` (e.g. `game:GuessTheNumber-v0-easy`, `rg:chain_sum`;
`pip install 'credo[envs]'`). An unknown id is a `ConfigError` that lists close ids.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Callable

from credo.config import ConfigError
from credo.envs.guess import GuessNumberEnv
from credo.envs.mastermind import MastermindEnv
from credo.families.multiturn.envs.shop import SHOP_ENVS

BUILTIN_ENVS: dict[str, Callable[..., Any]] = {"credo:GuessNumber-v0": GuessNumberEnv, "credo:Mastermind-v0": MastermindEnv,
                                               **SHOP_ENVS}


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
    if env_id in BUILTIN_ENVS:  # built-in ids outside credo: (shopsim:) never reach gem
        return
    known = list(BUILTIN_ENVS) if env_id.startswith("credo:") else gem_ids()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known + list(BUILTIN_ENVS), n=5, cutoff=0.5)
        hint = f"; close ids: {', '.join(close)}" if close else ""
        raise ConfigError(f"config key 'env.id' = '{env_id}' is not a known environment{hint} "
                          f"(built-in: {', '.join(BUILTIN_ENVS)}; GEM ids such as 'game:GuessTheNumber-v0-easy')")


def make_env(env_id: str, **kwargs):
    """A fresh environment for `env_id` with constructor overrides `kwargs` (GEM merges them over its defaults)."""
    check_env_id(env_id)
    if env_id in BUILTIN_ENVS:
        try:
            return BUILTIN_ENVS[env_id](**kwargs)
        except TypeError as e:
            raise ConfigError(f"config key 'env.kwargs' for '{env_id}': {e}") from None
    import gem

    return gem.make(env_id, **kwargs)
