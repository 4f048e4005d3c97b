"""The shop env by hand: tool outputs, exact rewards, invalid calls, the turn budget, failure types, GEM's MCP form."""

import json

import pytest

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES
from credo.families.multiturn.envs.shop.env import LEVELS, ShopEnv

TINY = "credo:Shop-v0-tiny"


def product_line(env, pid, fields=("category", "brand", "colour", "material", "size")):
    """A product line rebuilt from the raw arrays (vocabulary lookups by hand, not Catalogue.line)."""
    cat = env.cat
    words = [cat.vocab[f][int(cat.attrs[pid][ATTRIBUTES.index(f)])] for f in fields]
    return f"#{pid} " + " ".join(words) + f" ${int(cat.price[pid])}"


def sibling(env, differs: set):
    """A product of the target's family differing from it in exactly the fields `differs` (or None)."""
    t, cat = env.user.target, env.cat
    for pid in range(len(cat)):
        diff = {ATTRIBUTES[c] for c in range(5) if cat.attrs[pid][c] != cat.attrs[t][c]}
        if pid != t and diff == differs:
            return pid
    return None


def seed_with_sibling(differs: set, **kw):
    env = make_env(TINY, **kw)
    for seed in range(500):
        env.reset(seed=seed)
        pid = sibling(env, differs)
        if pid is not None:
            return env, seed, pid
    raise AssertionError(f"no user with a sibling differing in {differs}")


def test_hand_built_episode_outputs_and_rewards():
    env = make_env(TINY)
    obs, info = env.reset(seed=7)
    u, t = env.user, env.user.target
    words = {f: env.cat.vocab[f][int(env.cat.attrs[t][ATTRIBUTES.index(f)])] for f in ATTRIBUTES}
    price = int(env.cat.price[t])
    budget = -(-price // 10) * 10
    past = ", ".join(f"{words['brand']} {h['category']}" for h in u.history)
    assert obs == f"want: {words['category']} {words['colour']} {words['material']}; budget ${budget}; past: {past}"
    assert all(h["brand"] == words["brand"] and h["category"] != words["category"] for h in u.history)

    assert env.step("I need the size. <ask>what size do you need?</ask>") == \
        (f"size: {words['size']}", 0.0, False, False, {"tool": "ask_user"})
    assert env.step("<ask>which brand?</ask>")[0] == "brand: as usual"  # implicit: only the past purchases show it
    query = " ".join(words[f] for f in ATTRIBUTES)
    obs, r, term, trunc, info = env.step(f"<search>{query}</search>")
    lines = obs.split("\n")
    assert (r, term, trunc, info) == (0.0, False, False, {"tool": "search"})
    assert len(lines) == LEVELS["tiny"]["page_size"] and lines[0] == product_line(env, t)
    obs, r, term, trunc, info = env.step(f"ok \\boxed{{{t}}}")
    assert (obs, r, term, trunc) == (f"bought {t}", 1.0, True, False)
    assert info["failure_type"] == "none"
    m = info["episode_metrics"]
    assert (m["shop/success"], m["shop/attr_match"], m["shop/turns"], m["shop/asks"], m["shop/searches"]) == \
        (1.0, 1.0, 4.0, 2.0, 1.0)


def test_view_shows_every_attribute_and_the_rating():
    env = make_env(TINY)
    env.reset(seed=3)
    obs, r, term, _, _ = env.step("<view>5</view>")
    assert obs == product_line(env, 5) + f" {int(env.cat.rating[5]) / 10:.1f}*" and r == 0.0 and not term


@pytest.mark.parametrize("differs, checks_missed", [({"size"}, 1), ({"colour", "material"}, 2)])
def test_partial_credit_counts_matched_attributes(differs, checks_missed):
    env, seed, pid = seed_with_sibling(differs)
    env.reset(seed=seed)
    over_budget = int(env.cat.price[pid]) > env.user.budget
    matched = 6 - checks_missed - over_budget
    obs, r, term, _, info = env.step(f"<buy>{pid}</buy>")
    assert term and obs == f"bought {pid}"
    assert r == pytest.approx(0.5 * matched / 6) and info["episode_metrics"]["shop/attr_match"] == pytest.approx(matched / 6)
    env.reset(seed=seed)
    assert env.step(f"\\boxed{{{pid}}}")[1] == pytest.approx(0.5 * matched / 6)
    strict = make_env(TINY, partial_scale=0.0)
    strict.reset(seed=seed)
    assert strict.step(f"\\boxed{{{pid}}}")[1] == 0.0  # the paper's strict reward: all or nothing


def test_invalid_calls_cost_a_turn_and_a_penalty_and_the_episode_goes_on():
    env = make_env(TINY, max_turns=6)
    env.reset(seed=11)
    steps = [env.step(a) for a in ("buy the red one", "\\boxed{99999}", "<search>flavour=sweet</search>",
                                   "<search>   </search>", "<view>abc</view>")]
    assert [s[0] for s in steps] == ["invalid: no tool call", "invalid: no product 99999",
                                     "invalid: unknown filter flavour", "invalid: empty search",
                                     "invalid: view needs a product id"]
    assert all(s[1:] == (-0.1, False, False, {"tool": "invalid"}) for s in steps)
    obs, r, term, trunc, info = env.step(f"\\boxed{{{env.user.target}}}")  # the 6th turn still plays
    assert (r, term, trunc) == (1.0, True, False)
    assert info["episode_metrics"]["shop/invalid_calls"] == 5.0 and info["failure_type"] == "none"


def test_turn_budget_truncates_with_zero_reward_and_search_depth():
    env = make_env(TINY)
    env.reset(seed=2)
    outs = [env.step("<search>hat</search>") for _ in range(4)]
    assert [o[3] for o in outs] == [False, False, False, True] and not any(o[2] for o in outs)
    assert all(o[1] == 0.0 for o in outs)
    assert outs[-1][4]["failure_type"] == "search_depth" and outs[-1][4]["episode_metrics"]["shop/bought"] == 0.0
    env.reset(seed=2)
    outs = [env.step("hello") for _ in range(4)]
    assert outs[-1][3] and outs[-1][4]["failure_type"] == "format" and sum(o[1] for o in outs) == pytest.approx(-0.4)


def test_failure_types_from_the_trajectory():
    env, seed, pid = seed_with_sibling({"size"})
    env.reset(seed=seed)
    assert env.step(f"\\boxed{{{pid}}}")[4]["failure_type"] == "engagement"  # size was never asked
    env.reset(seed=seed)
    env.step("<ask>size</ask>")
    assert env.step(f"\\boxed{{{pid}}}")[4]["failure_type"] == "search_depth"  # told the size, bought another
    env, seed, pid = seed_with_sibling({"brand"})
    env.reset(seed=seed)
    env.step("<ask>size</ask>")
    assert env.step(f"\\boxed{{{pid}}}")[4]["failure_type"] == "personalisation"  # the past purchases' brand
    m = env.episode_metrics()
    assert (m["shop/fail_personalisation"], m["shop/fail_engagement"], m["shop/fail_search_depth"]) == (1.0, 0.0, 0.0)


def test_gem_mcp_tool_calls_match_the_compact_tags():
    a, b = make_env(TINY), make_env(TINY)
    a.reset(seed=5)
    b.reset(seed=5)
    w = a.user.words

    def mcp(name, **args):
        return f"<tool_call><tool_name>{name}</tool_name><arguments>{json.dumps(args)}</arguments></tool_call>"

    pairs = [("<ask>size</ask>", mcp("ask_user", question="size?")),
             (f"<search>{w['category']} size={w['size']} <=60</search>",
              mcp("search", query=w["category"], filters={"size": w["size"], "max_price": 60})),
             ("<view>4</view>", mcp("view", product_id=4)),
             ("<tool_call><tool_name>teleport</tool_name><arguments>{}</arguments></tool_call>", None)]
    for compact, long in pairs:
        if long is None:
            assert a.step(compact)[0] == "invalid: unknown tool"
            continue
        assert a.step(compact)[:4] == b.step(long)[:4]
    assert a.step(mcp("buy", product_id=a.user.target))[1] == 1.0


def test_search_filters_keep_only_matching_products():
    env = make_env(TINY, page_size=50)
    env.reset(seed=0)
    w = env.user.words
    obs = env.step(f"<search>{w['category']} brand={w['brand']} <=80</search>")[0]
    for line in obs.split("\n"):
        pid = int(line.split()[0].lstrip("#"))
        assert env.cat.words(pid)["brand"] == w["brand"] and int(env.cat.price[pid]) <= 80
    assert env.step("<search>brand=nosuchbrand</search>")[0] == "no results"


def test_bad_kwargs_name_the_key():
    with pytest.raises(ValueError, match="env.kwargs.stated"):
        ShopEnv(stated=("flavour",))
    with pytest.raises(ValueError, match="env.kwargs.n_products = 100000"):
        ShopEnv(**{**LEVELS["tiny"], "n_products": 100000})
    with pytest.raises(ValueError, match="distractors = 1 of n_history = 2"):
        ShopEnv(**{**LEVELS["tiny"], "distractors": 1})


def test_pickled_mid_episode_env_plays_on_identically():
    """What a process-based env worker (Ray) does: ship the env, not its catalogue, and go on from there."""
    import pickle
    import random

    env = make_env("credo:Shop-v0-hard")
    env.reset(seed=9)
    rng = random.Random(9)
    env.step(env.expert_action(rng))
    blob = pickle.dumps(env)
    assert len(blob) < 4000  # the 20k-product catalogue and its index stay behind (rebuilt from the cache)
    twin = pickle.loads(blob)
    assert twin.cat is env.cat
    for _ in range(4):
        action = env.expert_action(rng)
        assert twin.step(action) == env.step(action)
