"""The built-in Mastermind-lite: its peg rule against a brute-force count, its rewards, and its expert."""

import itertools
import random

import pytest

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.mastermind import MastermindEnv, pegs


def naive_pegs(guess, code):
    """Black: equal positions. White: greedily pair each remaining guess digit with an unused code digit."""
    black = [i for i in range(len(guess)) if guess[i] == code[i]]
    used = set(black)
    white = 0
    for i, g in enumerate(guess):
        if i in black:
            continue
        for j, c in enumerate(code):
            if j not in used and c == g:
                used.add(j)
                white += 1
                break
    return len(black), white


def test_pegs_match_a_greedy_count_on_every_pair():
    codes = list(itertools.product(range(1, 5), repeat=3))
    for g in codes:
        for c in codes:
            assert pegs(g, c) == naive_pegs(g, c), (g, c)
    assert pegs((1, 2), (2, 1)) == (0, 2) and pegs((1, 1), (1, 2)) == (1, 0) and pegs((3, 3), (1, 2)) == (0, 0)


def test_rewards_termination_and_truncation():
    env = make_env("credo:Mastermind-v0", positions=2, colours=3, max_turns=3)
    assert env.reset(seed=0)[0] == "code 2x1-3"
    env.code = (1, 3)
    assert env.step("11") == ("1b0w", 0.0, False, False, {"suffix": ""})
    assert env.step("guess 31") == ("0b2w", 0.0, False, False, {"suffix": ""})
    assert env.step("44 then 13") == ("2b0w", 1.0, True, False, {"suffix": ""})  # the last in-range code counts
    env.reset(seed=0)
    env.code = (1, 3)
    assert env.step("12")[3] is False and env.step("21")[3] is False
    assert env.step("22") == ("0b0w", 0.0, False, True, {"suffix": ""})  # out of turns: truncated
    env.reset(seed=0)
    assert env.step("45") == ("invalid", -0.1, True, False, {"suffix": ""})  # 4, 5 are not colours of 1-3
    with pytest.raises(ValueError, match="colours = 10"):
        MastermindEnv(colours=10)


def test_reset_draws_every_code_from_the_seed():
    env = MastermindEnv()
    seen = set()
    for s in range(200):
        env.reset(seed=s)
        first = env.code
        env.reset(seed=s)
        assert env.code == first
        seen.add(first)
    assert seen == set(itertools.product((1, 2, 3), repeat=2))


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 3, 6)])
def test_expert_solves_every_code_and_noise_hurts(shape):
    positions, colours, turns = shape
    env = MastermindEnv(positions=positions, colours=colours, max_turns=turns)
    for code in env.codes:
        env.reset(seed=0)
        env.code = code
        rng = random.Random(0)
        for _ in range(turns):
            obs, r, term, trunc, _ = env.step(env.expert_action(rng))
            if term or trunc:
                break
        assert r == 1.0 and obs == f"{positions}b0w", code
    wins = 0
    for s in range(300):
        env.reset(seed=s)
        rng = random.Random(s)
        for _ in range(turns):
            _, r, term, trunc, _ = env.step(env.expert_action(rng, noise=1.0))
            if term or trunc:
                break
        wins += r == 1.0
    assert wins < 270  # random guessing does not solve (nearly) every code


def test_recipe_and_warm_up_demos():
    from credo.config import load_recipe
    from credo.families.multiturn.task import EnvTask
    from credo.models import build_char_tokenizer
    from credo.tasks.render import plain_prompt
    from credo.families.multiturn.source import turn_format
    from tests.e2e.common import REPO

    r = load_recipe(REPO / "recipes" / "multiturn_mastermind.yaml")
    assert r.env.id == "credo:Mastermind-v0" and r.env.max_turns == r.env.kwargs["max_turns"] == 4
    tok = build_char_tokenizer()
    prompt_text, observation = turn_format(tok, plain_prompt)
    r.env.expert_noise = 0.0
    task = EnvTask(r.env, tok, prompt_text, observation)
    for i in range(20):  # a noiseless demo replays through a fresh env to a solve, in the source's layout
        p = task.train(i)
        actions = p.answer.split(tok.eos_token)
        env = MastermindEnv()
        assert p.prompt == observation(env.reset(seed=p.meta["env_seed"])[0])
        for k, a in enumerate(actions):
            text = a if k == 0 else a.split("\n")[-1]
            obs, rew, term, trunc, _ = env.step(text)
            if k < len(actions) - 1:
                assert actions[k + 1].startswith(observation(obs)), (k, actions)
        assert rew == 1.0 and term
