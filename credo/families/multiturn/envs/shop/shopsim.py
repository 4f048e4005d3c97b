"""`shopsim:<id>`: the real ShopSimulator (arXiv 2601.18225) behind GEM's protocol, when its package is installed.

ShopSimulator is not on PyPI and its data (Taobao products, Chinese instructions) is not reachable offline, so
this adapter is import-guarded and untested here (no CI job installs it). It is written against the interface
ShopSimulator's `shop_env/web_agent_site` inherits from WebShop (arXiv 2207.01206): a gym env
`WebAgentTextEnv(observation_mode="text", **kwargs)` with `reset(session) -> (obs, info)` and `step(action) ->
(obs, reward, done, info)`, actions `search[query]` and `click[element]` (inferred: the repository was not
readable from here; check it against the installed package before relying on it).

The shop's GEM tool calls are translated, so the same agent plays both envs: `<search>q</search>` -> `search[q]`,
`<view>x</view>` -> `click[x]`, `\\boxed{x}` / `<buy>x</buy>` -> `click[x]` then `click[buy now]`; text that already
is `search[...]` / `click[...]` passes through; `<ask>` is not supported (the multi-turn shopper of ShopSimulator
is an LLM service: `multi_eval/shopper.py`) and returns an invalid call. The env seed picks the session (task).
`shopsim:<Name>[-vN]` names the class `<Name>` of `web_agent_site.envs` (`shopsim:WebAgentTextEnv-v0`).
"""

from __future__ import annotations

import functools
import importlib
import re

from credo.families.multiturn.envs.shop.tools import parse_tool_call

MODULE = "web_agent_site.envs"
INSTALL = ("git clone https://github.com/ShopAgent-Team/ShopSimulator && pip install -e ShopSimulator/shop_env "
           "(then its setup.sh for the product data)")


def env_class_name(env_id: str) -> str:
    """`shopsim:<Name>[-vN]` -> `<Name>`, the class of `web_agent_site.envs` the id names."""
    return re.sub(r"-v\d+$", "", env_id.partition(":")[2])


def _load(env_id: str):
    from credo.config import ConfigError

    try:
        module = importlib.import_module(MODULE)
    except ImportError as e:
        raise ConfigError(f"config key 'env.id' = '{env_id}' needs the ShopSimulator package (module '{MODULE}' "
                          f"not importable: {e}); install it: {INSTALL}") from None
    name = env_class_name(env_id)
    if not isinstance(getattr(module, name, None), type):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and n.endswith("Env"))
        raise ConfigError(f"config key 'env.id' = '{env_id}': '{MODULE}' has no env class '{name}' "
                          f"(its env classes: {', '.join(found) or 'none'})")
    return getattr(module, name)


class ShopSimulatorEnv:
    """GEM's reset/step over ShopSimulator's WebShop-style text env (module docstring)."""

    def __init__(self, env_id: str = "shopsim:WebAgentTextEnv-v0", invalid_penalty: float = 0.1, **kwargs):
        self.env = _load(env_id)(observation_mode="text", **kwargs)
        self.invalid_penalty = invalid_penalty

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        obs, info = self.env.reset(session=seed)
        return str(obs), dict(info or {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        text = action.strip()
        if text.startswith(("search[", "click[")):
            return self._step(text)
        call = parse_tool_call(action)
        if isinstance(call, str) or call.name == "ask_user":
            reason = call if isinstance(call, str) else "ask_user is not supported by shopsim"
            return f"invalid: {reason}", -self.invalid_penalty, False, False, {"tool": "invalid"}
        if call.name == "search":
            return self._step(f"search[{call.query}]")
        obs, reward, done, trunc, info = self._step(f"click[{call.product}]")
        if call.name == "buy" and not done:
            return self._step("click[buy now]")
        return obs, reward, done, trunc, info

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, done, info = self.env.step(action)
        return str(obs), float(reward or 0.0), bool(done), False, dict(info or {})


def shopsim_env(env_id: str):
    """The constructor for `env_id` (its kwargs go to the ShopSimulator env class); a ConfigError naming the install
    when the package is absent, or the module's env classes when it has no class of that name."""
    _load(env_id)
    return functools.partial(ShopSimulatorEnv, env_id)
