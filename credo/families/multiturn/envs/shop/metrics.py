"""Episode outcome metrics of the shop env: full success, attribute match, and the paper's failure types.

ShopSimulator (arXiv 2601.18225) reports full success (the exact target bought) and attribute-level scores, and
sorts failures into deep search / product selection over long trajectories, personalisation (cues of the
profile ignored or misread) and user engagement (not asking). The env classifies each episode from its own
trajectory, first rule that applies:

    success           the target was bought
    format            nothing bought and no turn was a valid tool call (a tiny model's failure; not in the paper)
    engagement        the bought product misses an attribute the user would have told, and it was never asked
    personalisation   the bought product misses an attribute shown only by the past purchases
    search_depth      every other failure: nothing bought within the turn budget, or a product bought that misses an
                      attribute the agent had been told (stated, or asked and answered) or is over budget

The attribute match is over six checks: the five attributes equal to the target's and the price within the
budget (0 when nothing was bought). The rule order and the six checks are ours (inferred: the paper's error
analysis is by hand and its reward groups attributes, options and price).
"""

from __future__ import annotations

from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES, Catalogue
from credo.families.multiturn.envs.shop.user import User

FAILURE_TYPES = ("search_depth", "personalisation", "engagement", "format")
METRIC_KEYS = ("shop/success", "shop/attr_match", "shop/bought", *(f"shop/fail_{t}" for t in FAILURE_TYPES),
               "shop/turns", "shop/invalid_calls", "shop/asks", "shop/searches", "shop/views")
"""The keys of `episode_metrics` (all floats; every episode has all of them), in a fixed order."""


def attribute_checks(cat: Catalogue, user: User, product: int) -> dict[str, bool]:
    """The six checks of a bought product: each attribute equal to the target's, and 'budget'."""
    words = cat.words(product)
    checks = {f: words[f] == user.words[f] for f in ATTRIBUTES}
    checks["budget"] = int(cat.price[product]) <= user.budget
    return checks


def attribute_match(cat: Catalogue, user: User, product: int | None) -> float:
    """The fraction of the six checks a bought product passes (0.0 when nothing was bought)."""
    if product is None:
        return 0.0
    checks = attribute_checks(cat, user, product)
    return sum(checks.values()) / len(checks)


def failure_type(cat: Catalogue, user: User, bought: int | None, asked: set, valid_calls: int) -> str:
    """'none' for a success, else the failure type of the module docstring."""
    if bought == user.target:
        return "none"
    if bought is None:
        return "format" if valid_calls == 0 else "search_depth"
    missed = {f for f, ok in attribute_checks(cat, user, bought).items() if not ok}
    if any(f in user.askable and f not in asked for f in missed):
        return "engagement"
    if missed & set(user.implicit):
        return "personalisation"
    return "search_depth"


def episode_metrics(cat: Catalogue, user: User, *, bought: int | None, asked: set, turns: int, invalid_calls: int,
                    asks: int, searches: int, views: int) -> dict[str, float]:
    """The METRIC_KEYS of one episode (so far: the env reports them at the end, and on demand)."""
    kind = failure_type(cat, user, bought, asked, turns - invalid_calls)
    out = {"shop/success": float(bought == user.target), "shop/attr_match": attribute_match(cat, user, bought),
           "shop/bought": float(bought is not None)}
    out.update({f"shop/fail_{t}": float(kind == t) for t in FAILURE_TYPES})
    out.update({"shop/turns": float(turns), "shop/invalid_calls": float(invalid_calls), "shop/asks": float(asks),
                "shop/searches": float(searches), "shop/views": float(views)})
    return out


def aggregate(episodes: list[dict[str, float]]) -> dict[str, float]:
    """Means of every METRIC_KEYS over `episodes` (the rates: success, attribute match, each failure type's
    share of all episodes), plus 'shop/episodes'. Each failure type's share of the failures is
    fail_<type> / (1 - success)."""
    n = len(episodes)
    out = {k: (sum(e[k] for e in episodes) / n if n else float("nan")) for k in METRIC_KEYS}
    out["shop/episodes"] = float(n)
    return out
