"""The scripted expert: always the target at error rate 0, worse as the error rate grows; its warm-up demos."""

import random

import pytest

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.shop.evaluate import evaluate_policy, expert_policy
from credo.families.multiturn.envs.shop.metrics import FAILURE_TYPES


def success_rate(env_id: str, noise: float, n: int) -> dict:
    env = make_env(env_id)
    return evaluate_policy(lambda: env, expert_policy(env, noise, seed=0), n)


@pytest.mark.parametrize("env_id, turns", [("credo:Shop-v0-tiny", 3), ("credo:Shop-v0-easy", 4),
                                           ("credo:Shop-v0", 5), ("credo:Shop-v0-hard", 5)])
def test_noiseless_expert_always_buys_the_target(env_id, turns):
    m = success_rate(env_id, 0.0, 150)
    assert m["shop/success"] == 1.0 and m["shop/attr_match"] == 1.0
    assert m["shop/turns"] == turns and m["shop/invalid_calls"] == 0.0  # asks + search (+ view at hard) + buy


def test_success_drops_with_the_error_rate_and_failures_are_classified():
    rates = [success_rate("credo:Shop-v0-tiny", noise, 300) for noise in (0.0, 0.25, 0.5, 1.0)]
    succ = [m["shop/success"] for m in rates]
    assert succ[0] == 1.0 and succ[0] > succ[1] > succ[2] > succ[3] and succ[3] < 0.1
    for m in rates:  # every episode is a success or exactly one failure type
        assert m["shop/success"] + sum(m[f"shop/fail_{t}"] for t in FAILURE_TYPES) == pytest.approx(1.0)
    noisy = rates[2]
    assert min(noisy[f"shop/fail_{t}"] for t in ("search_depth", "personalisation", "engagement")) > 0.05


def test_warm_up_demos_replay_to_a_purchase_in_the_sources_layout():
    from credo.config import load_recipe
    from credo.families.multiturn.task import EnvTask
    from credo.models import build_char_tokenizer
    from credo.tasks.render import plain_prompt
    from credo.families.multiturn.source import turn_format
    from tests.e2e.common import REPO

    r = load_recipe(REPO / "recipes" / "shop.yaml")
    assert r.env.id == "credo:Shop-v0-tiny" and r.env.max_turns == r.env.kwargs["max_turns"]
    tok = build_char_tokenizer()
    prompt_text, observation = turn_format(tok, plain_prompt)
    r.env.expert_noise = 0.0
    task = EnvTask(r.env, tok, prompt_text, observation)
    for i in range(20):
        p = task.train(i)
        env = make_env(r.env.id, **r.env.kwargs)
        assert p.prompt == observation(env.reset(seed=p.meta["env_seed"])[0])
        rest = p.answer
        while True:  # action EOS observation action EOS ... action: replay each action, expect its observation
            action, sep, rest = rest.partition(tok.eos_token)
            obs, reward, term, trunc, _ = env.step(action)
            if not sep:
                break
            assert rest.startswith(observation(obs))
            rest = rest[len(observation(obs)):]
        assert reward == 1.0 and term and env.turn == 3
        assert len(tok(p.prompt + p.answer)["input_ids"]) + 1 <= r.env.max_total_tokens


def test_expert_prefixes_for_initialised_resampling():
    from credo.families.multiturn.resample import expert_actions

    env = make_env("credo:Shop-v0-hard")
    actions = expert_actions(env, 123, 10)
    assert [a[:5] for a in actions] == ["<ask>", "<ask>", "<sear", "<view", "\\boxe"]
    fresh = make_env("credo:Shop-v0-hard")
    fresh.reset(seed=123)
    rewards = [fresh.step(a)[1] for a in actions]
    assert rewards == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_noisy_calls_are_always_valid():
    env = make_env("credo:Shop-v0")
    rng = random.Random(0)
    for seed in range(100):
        env.reset(seed=seed)
        for _ in range(env.max_turns):
            obs, _, term, trunc, _ = env.step(env.expert_action(rng, 1.0))
            assert not obs.startswith("invalid"), obs
            if term or trunc:
                break
