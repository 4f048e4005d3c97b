"""A ShopSimulator-style shopping env (arXiv 2601.18225) with GEM's protocol (arXiv 2510.01051), synthetic and offline.

    env = ShopEnv(**LEVELS["tiny"])           # = make_env("credo:Shop-v0-tiny")
    env.reset(seed=4)  -> ("want: mug blue jute; budget $140; past: acme hat, acme shoe", {"tool": None})
    env.step("<ask>size</ask>")                      -> ("size: l", 0.0, False, False, info)
    env.step("<search>mug acme blue jute l</search>") -> ("#60 mug acme blue jute l $137\\n#10 mug orca ...", 0.0, ...)
    env.step("\\\\boxed{60}")                         -> ("bought 60", 1.0, True, False, info)   the target

Tools and their format: tools.py. Rewards: buying the target 1.0; buying another product `partial_scale` x its
attribute match (six checks, metrics.py; the paper's loose, additive reward; partial_scale 0 is its strict one,
since a product of binary checks is 1 only for the target); an invalid tool call -`invalid_penalty` and the
episode goes on (GEM's games end it; a shop agent gets to retry); every other call 0. `max_turns` calls without a
purchase truncate the episode. At the end `info["episode_metrics"]` holds metrics.METRIC_KEYS and
`info["failure_type"]` the failure type; `env.episode_metrics()` gives them at any time (for episodes the rollout
source cuts first). `expert_action(rng, noise)` is the scripted expert of expert.py.
"""

from __future__ import annotations

import functools
import random

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)
from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES, FULL_VOCAB, build_catalogue
from credo.families.multiturn.envs.shop.metrics import episode_metrics, failure_type
from credo.families.multiturn.envs.shop.search import index_for
from credo.families.multiturn.envs.shop.tools import ToolCall, parse_tool_call
from credo.families.multiturn.envs.shop.user import answer, request_text, sample_user

ALL_FIELDS = ATTRIBUTES + ("price",)

LEVELS = {
    "tiny": dict(n_products=100, family_size=3, vocab=(4, 4, 4, 3, 3), stated=("category", "colour", "material"),
                 implicit=("brand",), n_history=2, distractors=0, page_size=3, page_fields=ALL_FIELDS, max_turns=4),
    "easy": dict(n_products=1000, family_size=4, vocab=(8, 8, 8, 6, 4), stated=("category", "colour"),
                 implicit=("brand",), n_history=2, distractors=0, page_size=4, page_fields=ALL_FIELDS, max_turns=6),
    "medium": dict(n_products=5000, family_size=6, vocab=(12, 12, 10, 8, 5), stated=("category",),
                   implicit=("brand",), n_history=3, distractors=1, page_size=5, page_fields=ALL_FIELDS, max_turns=8),
    "hard": dict(n_products=20000, family_size=8, vocab=FULL_VOCAB, stated=("category",), implicit=("brand", "colour"),
                 n_history=3, distractors=1, page_size=5, page_fields=("category", "brand", "colour", "size", "price"),
                 max_turns=10),
}
"""Difficulty presets: catalogue size, near-duplicate density (family_size against the vocabulary), and how much is
hidden (stated / implicit / asked attributes, history distractors, material off the result page at 'hard')."""


class ShopEnv:
    """Find and buy the user's hidden target product with search / view / ask_user / buy (module docstring)."""

    def __init__(self, n_products: int = 5000, catalogue_seed: int = 0, family_size: int = 6,
                 vocab: tuple = (12, 12, 10, 8, 5), stated: tuple = ("category",), implicit: tuple = ("brand",),
                 n_history: int = 3, distractors: int = 1, page_size: int = 5, page_fields: tuple = ALL_FIELDS,
                 max_turns: int = 8, partial_scale: float = 0.5, invalid_penalty: float = 0.1):
        for name, fields in (("stated", stated), ("implicit", implicit)):
            if any(f not in ATTRIBUTES for f in fields):
                raise ConfigError(f"env.kwargs.{name} = {list(fields)}: expected fields among {list(ATTRIBUTES)}")
        if set(stated) & set(implicit):
            raise ConfigError(f"env.kwargs: {sorted(set(stated) & set(implicit))} both stated and implicit")
        if any(f not in ALL_FIELDS + ("rating",) for f in page_fields):
            raise ConfigError(f"env.kwargs.page_fields = {list(page_fields)}: expected among {list(ALL_FIELDS)} + rating")
        if implicit and not 2 * distractors < n_history:
            raise ConfigError(f"env.kwargs: distractors = {distractors} of n_history = {n_history}, expected fewer "
                             "than half (the past purchases' majority shows the implicit preference)")
        if page_size < 1 or max_turns < 1:
            raise ConfigError(f"env.kwargs: page_size = {page_size}, max_turns = {max_turns}, expected both >= 1")
        self.catalogue_args = (int(n_products), int(catalogue_seed), int(family_size), tuple(vocab))
        self.user_args = dict(stated=tuple(stated), implicit=tuple(implicit), n_history=int(n_history),
                              distractors=int(distractors))
        self.page_size, self.page_fields, self.max_turns = int(page_size), tuple(page_fields), int(max_turns)
        self.partial_scale, self.invalid_penalty = float(partial_scale), float(invalid_penalty)
        self._attach()
        self.reset(seed=0)

    def _attach(self) -> None:
        self.cat = build_catalogue(*self.catalogue_args)
        self.index = index_for(self.cat)

    def __getstate__(self) -> dict:  # the catalogue and its index are rebuilt (cached) where the env lands
        return {k: v for k, v in self.__dict__.items() if k not in ("cat", "index")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._attach()

    # ------------------------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.user = sample_user(self.cat, seed, **self.user_args)
        self.turn, self.invalid_calls, self.searches, self.views = 0, 0, 0, 0
        self.bought: int | None = None
        self.asked: set[str] = set()
        self.asks = 0
        self.known = {f: self.user.words[f] for f in self.user.stated}  # what the agent has been told
        self.last_query: str | None = None
        self.page: list[int] = []
        self.viewed: set[int] = set()
        self.request = request_text(self.user)
        return self.request, {"tool": None}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        call = parse_tool_call(action)
        if isinstance(call, str):
            obs, reward, terminated, info = self._invalid(call)
        else:
            obs, reward, terminated, info = self._execute(call)
        truncated = not terminated and self.turn >= self.max_turns
        if terminated or truncated:
            info["episode_metrics"] = self.episode_metrics()
            info["failure_type"] = self.failure_type()
        return obs, reward, terminated, truncated, info

    def _invalid(self, reason: str) -> tuple[str, float, bool, dict]:
        self.invalid_calls += 1
        return f"invalid: {reason}", -self.invalid_penalty, False, {"tool": "invalid"}

    def _execute(self, call: ToolCall) -> tuple[str, float, bool, dict]:
        info = {"tool": call.name}
        if call.name == "search":
            self.searches += 1
            self.last_query = call.query
            self.page = self.index.search(call.query, call.filters, self.page_size)
            obs = "\n".join(self.cat.line(i, self.page_fields) for i in self.page) or "no results"
            return obs, 0.0, False, info
        if call.name == "ask_user":
            self.asks += 1
            obs, field = answer(self.user, call.question)
            if field is not None:
                self.asked.add(field)
                if field in ATTRIBUTES and field not in self.user.implicit:
                    self.known[field] = self.user.words[field]
            return obs, 0.0, False, info
        if not 0 <= call.product < len(self.cat):
            return self._invalid(f"no product {call.product}")
        if call.name == "view":
            self.views += 1
            self.viewed.add(call.product)
            return self.cat.line(call.product, ALL_FIELDS + ("rating",)), 0.0, False, info
        self.bought = call.product
        reward = 1.0 if call.product == self.user.target else self.partial_scale * self.attr_match()
        return f"bought {call.product}", reward, True, info

    # ------------------------------------------------------------------------------------ outcome
    def attr_match(self) -> float:
        return self.episode_metrics()["shop/attr_match"]

    def episode_metrics(self) -> dict[str, float]:
        """metrics.METRIC_KEYS of the episode so far (final once it has ended)."""
        return episode_metrics(self.cat, self.user, bought=self.bought, asked=self.asked, turns=self.turn,
                               invalid_calls=self.invalid_calls, asks=self.asks, searches=self.searches,
                               views=self.views)

    def failure_type(self) -> str:
        return failure_type(self.cat, self.user, self.bought, self.asked, self.turn - self.invalid_calls)

    def expert_action(self, rng: random.Random, noise: float = 0.0) -> str:
        """The scripted expert's next call (expert.py), or with probability `noise` a random valid call."""
        from credo.families.multiturn.envs.shop.expert import expert_action

        return expert_action(self, rng, noise)


def level_env(level: str):
    """A constructor of the `level` preset; keyword arguments override the preset's (as gem.make's do)."""
    return functools.partial(ShopEnv, **LEVELS[level])
