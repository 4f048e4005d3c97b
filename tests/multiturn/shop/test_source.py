"""The shop env inside the multi-turn rollout source: token layout, rewards, the episode metrics the evaluator reads,
episodes the source cuts, the registry and the ShopSimulator adapter's error."""

import importlib.util
import re

import pytest

from credo.config import ConfigError
from credo.families.multiturn.envs import check_env_id, check_env_kwargs, env_class, make_env
from credo.families.multiturn.envs.shop import SHOP_ENVS, ShopEnv
from credo.families.multiturn.envs.shop.evaluate import EVAL_SEED_BASE, evaluate_episodes
from credo.families.multiturn import source as multiturn
from tests.multiturn.common import env_cfg, source


def reference_agent(context: str) -> str:
    """A shopper written from the transcript alone: ask the size, search with the request + brand + size, buy the
    first product listed."""
    request = context.split("\n")[1] if context.startswith("\n") else context.split("\n")[0]
    turns = context.count("<eos>")
    if turns == 0:
        return "<ask>size</ask>"
    if turns == 1:
        want = re.search(r"want: ([a-z ]+);", request).group(1).split()
        brand = re.search(r"past: (\w+) ", request).group(1)
        size = re.search(r"size: (\w+)", context).group(1)
        return f"<search>{want[0]} {brand} {' '.join(want[1:])} {size}</search>"
    first_listed = re.search(r"<eos>\n#(\d+) ", context.split("</search>")[-1]).group(1)
    return f"\\boxed{{{first_listed}}}"


def shop_cfg(**kw):
    return env_cfg(**{**dict(id="credo:Shop-v0-tiny", kwargs={}, max_turns=4, max_total_tokens=448,
                             max_new_tokens_per_turn=40), **kw})


def test_episodes_through_the_source_layout_rewards_and_metrics():
    src, backend, tok = source(shop_cfg(), reference_agent, envs=lambda: make_env("credo:Shop-v0-tiny"), P=3, G=2)
    eps, stats = src.run_episodes([11, 12, 13], temperature=1.0, top_p=1.0, sample_seeds=None)
    assert backend.calls == [3, 3, 3]  # one generate call per turn for every live episode
    for e in eps:
        assert e.end == "terminated" and e.turn_rewards == [0.0, 0.0, 1.0]
        assert len(e.turn_spans) == 3 and e.observations[-1] == f"bought {e.env.user.target}"
        for k, (start, end) in enumerate(e.turn_spans):  # turns: mask 1, their index as chunk id
            assert e.response_mask[start:end] == [1] * (end - start) and set(e.chunk_ids[start:end]) == {k}
            if k < 2:  # then the observation: mask 0, chunk -1, the env's reply rendered as '\n{obs}\n'
                nxt = e.turn_spans[k + 1][0]
                assert e.response_mask[end:nxt] == [0] * (nxt - end) and set(e.chunk_ids[end:nxt]) == {-1}
                assert tok.decode(e.response_ids[end:nxt]) == f"\n{e.observations[k]}\n"
        assert tok.decode(e.response_ids[e.turn_spans[1][0]:e.turn_spans[1][1]], skip_special_tokens=True) \
            .startswith("<search>")
    m = evaluate_episodes(eps)
    assert (m["shop/success"], m["shop/attr_match"], m["shop/turns"], m["shop/episodes"]) == (1.0, 1.0, 3.0, 3.0)
    assert EVAL_SEED_BASE == multiturn.EVAL_SEED_BASE  # held-out users are the source evaluator's seeds


def test_episodes_the_source_cuts_still_report_metrics():
    # 160 tokens: the result page does not fit, so the source ends the episode before the env does
    src, _, _ = source(shop_cfg(max_total_tokens=160), reference_agent, envs=lambda: make_env("credo:Shop-v0-tiny"),
                       P=2, G=1)
    eps, _ = src.run_episodes([21, 22], temperature=1.0, top_p=1.0, sample_seeds=None)
    assert [e.end for e in eps] == ["max_total_tokens"] * 2
    m = evaluate_episodes(eps)
    assert m["shop/bought"] == 0.0 and m["shop/fail_search_depth"] == 1.0 and m["shop/searches"] == 1.0


def test_registry_ids_kwargs_and_expert_lookup():
    for env_id in SHOP_ENVS:
        check_env_id(env_id)  # built in: never sent to gem
        assert env_class(env_id) is ShopEnv  # the preset's class: the warm-up check finds expert_action on it
    assert {"credo:Shop-v0", "credo:Shop-v0-tiny", "credo:Shop-v0-easy", "credo:Shop-v0-hard"} <= set(SHOP_ENVS)
    assert make_env("credo:Shop-v0-easy", max_turns=9).max_turns == 9
    check_env_kwargs("credo:Shop-v0-tiny", {"max_turns": 3, "partial_scale": 0.0})
    with pytest.raises(ConfigError, match=r"'env.kwargs.colours' is not a setting of 'credo:Shop-v0-tiny'"):
        check_env_kwargs("credo:Shop-v0-tiny", {"colours": 3})
    with pytest.raises(ConfigError, match=r"'credo:Shop-v0-tiny'.*unexpected keyword argument 'colours'"):
        make_env("credo:Shop-v0-tiny", colours=3)
    with pytest.raises(ConfigError, match=r"close ids: credo:Shop-v0"):
        check_env_id("credo:Shop-v1")


def test_shopsim_ids_without_the_package_fail_at_check_naming_the_install():
    if importlib.util.find_spec("web_agent_site") is not None:
        pytest.skip("ShopSimulator is installed here: test_shopsim_adapter_plays_the_real_env covers it")
    for env_id in ("shopsim:WebAgentTextEnv-v0", "shopsim:AnyOtherEnv"):
        with pytest.raises(ConfigError, match=rf"'{env_id}' needs the ShopSimulator package "
                                              r"\(module 'web_agent_site.envs' not importable.*git clone"):
            check_env_id(env_id)  # at `credo check`, before any warm-up
        with pytest.raises(ConfigError, match="needs the ShopSimulator package"):
            make_env(env_id)


def test_shopsim_adapter_plays_the_real_env():
    """Against the real package only (not in CI): the shop's tool calls reach WebShop-style actions."""
    pytest.importorskip("web_agent_site.envs")
    env = make_env("shopsim:WebAgentTextEnv-v0")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, str) and obs
    obs, reward, terminated, truncated, _ = env.step("<ask>size</ask>")  # not supported there: an invalid call
    assert obs.startswith("invalid:") and reward == -0.1 and not (terminated or truncated)
    obs, reward, terminated, _, _ = env.step("<search>shirt</search>")
    assert isinstance(obs, str) and reward == 0.0 and not terminated


@pytest.mark.parametrize("recipe", [pytest.param("recipes/shop.yaml", marks=pytest.mark.slow),  # builds the tiny model
                                    "recipes/gpu/shop_qwen3_4b.yaml"])
def test_shop_recipes_pass_credo_check(recipe):
    """Every check `credo run` makes before its first step (the expert for the warm-up, env.kwargs, the prompt
    budget with the tiny model's tokenizer); the GPU recipe plays the 100k-product 'hard' level."""
    from pathlib import Path

    from credo.config import load_recipe
    from credo.train.build import check_run

    r = load_recipe(str(Path(__file__).resolve().parents[3] / recipe))
    check_run(r)
    assert r.env.id.startswith("credo:Shop-v0") and r.stages.rollout == "multiturn" and r.sft.steps > 0
    if "gpu" in recipe:
        assert r.env.kwargs["n_products"] == 100_000 and r.rollout.backend == "vllm"
