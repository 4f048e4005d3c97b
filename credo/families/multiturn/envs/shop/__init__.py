"""A ShopSimulator-style shopping env (arXiv 2601.18225) with GEM's protocol: personalised, multi-turn, tool-using
product search over a seeded synthetic catalogue (docs/shop.md).

SHOP_ENVS maps the env ids to constructors (keyword arguments override a level's preset, as gem.make's do):
`credo:Shop-v0` (the 'medium' level), `credo:Shop-v0-tiny` (a tiny char-level model learns it on a CPU),
`credo:Shop-v0-easy`, `credo:Shop-v0-hard`. `shopsim_env(id)` builds `shopsim:<id>`, the real ShopSimulator when
its package is installed (shopsim.py; the env table's ADAPTERS routes the prefix to it).
"""

from credo.families.multiturn.envs.shop.env import LEVELS, ShopEnv, level_env
from credo.families.multiturn.envs.shop.metrics import METRIC_KEYS, aggregate
from credo.families.multiturn.envs.shop.shopsim import shopsim_env

SHOP_ENVS = {"credo:Shop-v0": level_env("medium"), "credo:Shop-v0-tiny": level_env("tiny"),
             "credo:Shop-v0-easy": level_env("easy"), "credo:Shop-v0-hard": level_env("hard")}

__all__ = ["LEVELS", "METRIC_KEYS", "SHOP_ENVS", "ShopEnv", "aggregate", "level_env", "shopsim_env"]
