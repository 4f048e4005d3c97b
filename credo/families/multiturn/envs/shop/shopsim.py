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
"""

from __future__ import annotations

import importlib

from credo.families.multiturn.envs.shop.tools import parse_tool_call

MODULE = "web_agent_site.envs"
INSTALL = ("git clone https://github.com/ShopAgent-Team/ShopSimulator && pip install -e ShopSimulator/shop_env "
           "(then its setup.sh for the product data)")


def _load(env_id: str):
    try:
        module = importlib.import_module(MODULE)
    except ImportError as e:
        from credo.config import ConfigError

        raise ConfigError(f"config key 'env.id' = '{env_id}' needs the ShopSimulator package (module '{MODULE}' "
                          f"not importable: {e}); install it: {INSTALL}") from None
    return module.WebAgentTextEnv


class ShopSimulatorEnv:
    """GEM's reset/step over ShopSimulator's WebShop-style text env (module docstring)."""

    def __init__(self, env_id: str = "shopsim:single-v0", invalid_penalty: float = 0.1, **kwargs):
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
    """A constructor for `env_id` (kwargs go to WebAgentTextEnv)."""
    return lambda **kwargs: ShopSimulatorEnv(env_id, **kwargs)
