"""IPA's chunk-level initialised resampling: episodes that start from an expert prefix replayed through the env."""

import pytest

from credo.config import ConfigError
from credo.families.multiturn.resample import choose_prefixes, expert_actions
from tests.multiturn.common import FixedTarget, env_cfg, source


def test_expert_actions_and_anchor_draws():
    # target 5 in 1-7: binary search guesses 4 (higher), 6 (lower), 5 (correct)
    assert expert_actions(FixedTarget(5), 123, 3) == ["4", "6", "5"]
    assert expert_actions(FixedTarget(4), 123, 3) == ["4"]
    assert expert_actions(FixedTarget(5), 123, 2) == ["4", "6"]  # stops at max_turns
    experts = [["4", "6", "5"]] * 200 + [["4"]]
    drawn = choose_prefixes(experts, [True] * 199 + [False, True], list(range(201)))
    assert {len(p) for p in drawn[:199]} == {1, 2}  # 1 .. L-1, never the whole expert episode
    assert all(p == ["4", "6", "5"][:len(p)] for p in drawn[:199])
    assert drawn[199] == [] and drawn[200] == []  # not resampled; an expert of one turn leaves no prefix
    assert choose_prefixes(experts, [True] * 201, list(range(201)))[:199] == drawn[:199]


def always(text):
    return lambda context: text


def test_resampled_episodes_continue_the_replayed_game():
    src, backend, tok = source(env_cfg(init_resample_frac=1.0), always("5"), P=2, G=2)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    seen = set()
    for step in range(6):
        batch = src.rollout(step=step)
        assert batch.metrics["env/resampled_frac"] == 1.0
        for s in batch.samples:
            k = len(s.meta["prefix_actions"])
            seen.add(k)
            prompt = ids("\nguess 1-7\n") + ids("4") + [eos] + ids("\nhigher\n")
            if k == 2:
                prompt += ids("6") + [eos] + ids("\nlower\n")
            assert s.meta["prefix_actions"] == ["4", "6"][:k] and s.prompt_ids == prompt
            # the model's one turn solves the game the prefix left: reward 1 on chunk 0, no prefix token trained
            assert s.response_ids == ids("5") + [eos] and s.response_mask == [1, 1]
            assert s.meta["chunk_ids"] == [0, 0] and s.meta["turn_rewards"] == [1.0] and s.meta["end"] == "terminated"
        assert batch.metrics["env/prefix_turns_mean"] == pytest.approx(
            sum(len(s.meta["prefix_actions"]) for s in batch.samples) / 4)
    assert seen == {1, 2}
    again = source(env_cfg(init_resample_frac=1.0), always("5"), P=2, G=2)[0].rollout(step=3)
    assert [s.prompt_ids for s in again.samples] == [s.prompt_ids for s in src.rollout(step=3).samples]


def test_the_env_counts_the_replayed_turns():
    # a wrong guess every turn: the env (max_turns 3) truncates after 3 steps, prefix included
    src, _, _ = source(env_cfg(init_resample_frac=1.0), always("1"), P=2, G=2)
    for s in src.rollout(step=0).samples:
        k = len(s.meta["prefix_actions"])
        assert len(s.meta["turn_spans"]) == 3 - k and s.meta["end"] == "env_truncated"
        assert max(s.meta["chunk_ids"]) == 2 - k and s.meta["turn_rewards"] == [0.0] * (3 - k)


def test_fraction_picks_the_first_episodes_of_each_game_and_zero_is_off():
    src, _, _ = source(env_cfg(init_resample_frac=0.5), always("5"), P=2, G=2)
    batch = src.rollout(step=0)
    assert [bool(s.meta["prefix_actions"]) for s in batch.samples] == [True, False, True, False]
    assert batch.metrics["env/resampled_frac"] == 0.5
    off = source(env_cfg(), always("5"), P=2, G=2)[0].rollout(step=0)
    assert all(s.meta["prefix_actions"] == [] for s in off.samples) and "env/resampled_frac" not in off.metrics


class NoExpert:
    def reset(self, seed=None):
        return "hi", {}

    def step(self, action):
        return "bye", 0.0, True, False, {}


def test_env_without_expert_is_a_config_error():
    src, _, _ = source(env_cfg(init_resample_frac=0.5), always("5"), envs=NoExpert, P=1, G=2)
    with pytest.raises(ConfigError, match="'env.init_resample_frac' needs an env with a scripted expert"):
        src.rollout(step=0)
