"""The run's own evaluator (EnvEvaluator) logs the shop's failure-type breakdown as eval/shop/*: checked against a
hand count over hand-built held-out episodes of known outcome, and against the shop's evaluate.py on the same
episodes. An env that reports no metrics adds no key (other recipes' metrics stay as they were)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.shop import ShopEnv
from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES
from credo.families.multiturn.envs.shop.evaluate import EVAL_SEED_BASE, evaluate_episodes
from credo.families.multiturn.envs.shop.metrics import METRIC_KEYS
from credo.families.multiturn.source import EnvEvaluator
from tests.multiturn.common import env_cfg, source

TINY = "credo:Shop-v0-tiny"


def shop_cfg(**kw):
    return env_cfg(**{**dict(id=TINY, kwargs={}, max_turns=4, max_total_tokens=448, max_new_tokens_per_turn=40), **kw})


def near_duplicate(env: ShopEnv, field: str) -> int | None:
    """A product equal to the user's target in every attribute but `field` (None when the catalogue has none)."""
    want = env.cat.words(env.user.target)
    for p in range(len(env.cat)):
        w = env.cat.words(p)
        if w[field] != want[field] and all(w[f] == want[f] for f in ATTRIBUTES if f != field):
            return p
    return None


KINDS = ("expert", "garbage", "search_only", "wrong_size", "wrong_brand")
NEAR = {"wrong_size": "size", "wrong_brand": "brand"}
"""The planned behaviours; a wrong_* episode buys the target's near-duplicate that differs in this field only."""


def plan_episodes(n_each: int = 2, extra: int = 0) -> tuple[dict, list[dict]]:
    """Held-out seeds 0, 1, ... each given a behaviour of known outcome, until every kind has `n_each` episodes
    (a seed whose target has no needed near-duplicate plays the expert), then `extra` more expert seeds.
    Returns {request line: plan} (the policy finds its plan by the request) and the plans in seed order."""
    wanted = [k for k in KINDS for _ in range(n_each)]
    by_request, plans = {}, []
    while wanted or extra:
        env = make_env(TINY)
        request, _ = env.reset(seed=EVAL_SEED_BASE + len(plans))
        assert request not in by_request  # distinct requests: the policy can tell the episodes apart
        kind = next((k for k in wanted if k not in NEAR or near_duplicate(env, NEAR[k]) is not None), "expert")
        if kind in wanted:
            wanted.remove(kind)
        elif not wanted:
            extra -= 1
        plan = {"kind": kind, "env": env, "product": near_duplicate(env, NEAR[kind]) if kind in NEAR else None}
        by_request[request] = plan
        plans.append(plan)
    return by_request, plans


def hand_outcome(plan: dict) -> dict:
    """What the plan's episode must report, counted by hand from the plan (not through the shop's metrics code)."""
    kind = plan["kind"]
    if kind == "expert":
        return dict(type="none", attr=1.0, bought=1, turns=3, asks=1, searches=1, invalid=0)
    if kind == "garbage":
        return dict(type="format", attr=0.0, bought=0, turns=4, asks=0, searches=0, invalid=4)
    if kind == "search_only":
        return dict(type="search_depth", attr=0.0, bought=0, turns=4, asks=1, searches=3, invalid=0)
    env, p = plan["env"], plan["product"]
    same = sum(env.cat.words(p)[f] == env.cat.words(env.user.target)[f] for f in ATTRIBUTES)
    attr = (same + (int(env.cat.price[p]) <= env.user.budget)) / 6
    if kind == "wrong_size":  # bought at once, the size never asked
        return dict(type="engagement", attr=attr, bought=1, turns=1, asks=0, searches=0, invalid=0)
    return dict(type="personalisation", attr=attr, bought=1, turns=2, asks=1, searches=0, invalid=0)  # wrong brand


def scripted_policy(by_request: dict):
    """Plays each episode's plan, found by the request line that opens its transcript."""
    def act(context: str) -> str:
        request = context.split("\n")[1]
        plan, turns = by_request[request], context.count("<eos>")
        kind = plan["kind"]
        if kind == "garbage":
            return "hello"
        if kind == "wrong_size":
            return f"\\boxed{{{plan['product']}}}"
        if kind == "wrong_brand":
            return "<ask>size</ask>" if turns == 0 else f"\\boxed{{{plan['product']}}}"
        if kind == "search_only":
            category = re.search(r"want: (\w+)", request).group(1)
            return "<ask>size</ask>" if turns == 0 else f"<search>{category}</search>"
        return expert_turn(context, request, turns)
    return act


def expert_turn(context: str, request: str, turns: int) -> str:
    """Ask the size, search with everything known, buy the first product listed."""
    if turns == 0:
        return "<ask>size</ask>"
    if turns == 1:
        want = re.search(r"want: ([a-z ]+);", request).group(1).split()
        brand = re.search(r"past: (\w+) ", request).group(1)
        size = re.search(r"size: (\w+)", context).group(1)
        return f"<search>{want[0]} {brand} {' '.join(want[1:])} {size}</search>"
    return "\\boxed{" + re.search(r"<eos>\n#(\d+) ", context.split("</search>")[-1]).group(1) + "}"


class CrashingShop(ShopEnv):
    """A shop whose env steps raise: its episodes fail (left out of the metrics, as from eval/return)."""

    def step(self, action):
        raise RuntimeError("the shop crashed")


def crashing_tiny() -> CrashingShop:
    from credo.families.multiturn.envs.shop.env import LEVELS

    return CrashingShop(**LEVELS["tiny"])


def test_the_evaluator_logs_the_failure_breakdown_that_a_hand_count_gives():
    by_request, plans = plan_episodes(extra=1)
    n = len(plans) - 1  # the last held-out episode's env crashes at its first step
    made = iter(range(n + 1))
    factory = lambda: crashing_tiny() if next(made) == n else make_env(TINY)  # noqa: E731
    src, _, _ = source(shop_cfg(), scripted_policy(by_request), envs=factory, P=1, G=1)
    evaluator = EnvEvaluator(src, n + 1, temperature=0.0, seed=0)
    evaluator()
    got = evaluator.extra_metrics

    outcomes = [hand_outcome(p) for p in plans[:n]]
    kinds = Counter(o["type"] for o in outcomes)
    assert kinds["engagement"] >= 2 and kinds["personalisation"] >= 2 and kinds["format"] >= 2
    want = {"eval/shop/success": kinds["none"] / n, "eval/shop/attr_match": sum(o["attr"] for o in outcomes) / n,
            "eval/shop/bought": sum(o["bought"] for o in outcomes) / n,
            "eval/shop/turns": sum(o["turns"] for o in outcomes) / n,
            "eval/shop/asks": sum(o["asks"] for o in outcomes) / n,
            "eval/shop/searches": sum(o["searches"] for o in outcomes) / n,
            "eval/shop/invalid_calls": sum(o["invalid"] for o in outcomes) / n, "eval/shop/views": 0.0}
    want.update({f"eval/shop/fail_{t}": kinds[t] / n
                 for t in ("search_depth", "personalisation", "engagement", "format")})
    assert set(got) == set(want) == {f"eval/{k}" for k in METRIC_KEYS}
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    # the failure shares and the success rate cover every episode once
    assert sum(got[f"eval/shop/fail_{t}"] for t in ("search_depth", "personalisation", "engagement", "format")) \
        == pytest.approx(1 - got["eval/shop/success"])


def test_the_evaluator_agrees_with_the_shops_evaluate_py_on_the_same_episodes():
    by_request, plans = plan_episodes(n_each=1)
    src, _, _ = source(shop_cfg(), scripted_policy(by_request), envs=lambda: make_env(TINY), P=1, G=1)
    evaluator = EnvEvaluator(src, len(plans), temperature=0.0, seed=0)
    ret = evaluator()
    eps, _ = src.run_episodes([EVAL_SEED_BASE + i for i in range(len(plans))], temperature=1.0, top_p=1.0,
                              sample_seeds=None)
    offline = evaluate_episodes(eps)
    assert {f"eval/{k}": v for k, v in offline.items() if k != "shop/episodes"} == evaluator.extra_metrics
    assert ret == pytest.approx(sum(sum(e.turn_rewards) for e in eps) / len(eps))


def test_episodes_the_source_cuts_count_with_what_they_did():
    by_request, plans = plan_episodes(n_each=1)
    expert_only = {r: {"kind": "expert"} for r in by_request}
    # 160 tokens: the result page does not fit, so the source ends every episode after its search
    src, _, _ = source(shop_cfg(max_total_tokens=160), scripted_policy(expert_only), envs=lambda: make_env(TINY),
                       P=1, G=1)
    evaluator = EnvEvaluator(src, len(plans), temperature=0.0, seed=0)
    evaluator()
    m = evaluator.extra_metrics
    assert (m["eval/shop/bought"], m["eval/shop/fail_search_depth"], m["eval/shop/searches"]) == (0.0, 1.0, 1.0)


class StepOnly:
    """An env seen only through reset and step, as through a Ray env worker's proxy (no episode_metrics method)."""

    def __init__(self, env):
        self._env = env

    def reset(self, seed=None):
        return self._env.reset(seed=seed)

    def step(self, action):
        return self._env.step(action)


def test_an_env_without_the_method_reports_through_its_last_steps_info():
    by_request, plans = plan_episodes(n_each=1)
    local, _, _ = source(shop_cfg(), scripted_policy(by_request), envs=lambda: make_env(TINY), P=1, G=1)
    proxied, _, _ = source(shop_cfg(), scripted_policy(by_request), envs=lambda: StepOnly(make_env(TINY)), P=1, G=1)
    a, b = (EnvEvaluator(s, len(plans), temperature=0.0, seed=0) for s in (local, proxied))
    assert a() == b()
    assert a.extra_metrics == b.extra_metrics and a.extra_metrics  # every planned episode ends in the env


def test_an_env_without_episode_metrics_adds_no_key():
    src, _, _ = source(env_cfg(), lambda ctx: "5", P=1, G=1)  # the guess game (target 5)
    evaluator = EnvEvaluator(src, 3, temperature=0.0, seed=0)
    assert evaluator() == 1.0
    assert evaluator.extra_metrics == {}
