"""credo.families.multiturn.resample with a recording env: how the expert is played (seed, noise, stop conditions), the
anchor draw's range and the error of an env without an expert."""

from __future__ import annotations

import random

import pytest

from credo.config import ConfigError
from credo.families.multiturn.resample import choose_prefixes, expert_actions


class ScriptedEnv:
    """Ends (terminated or truncated) at turn `end_at`; the expert's action names the turn, its noise and a draw."""

    def __init__(self, end_at=None, truncate=False):
        self.end_at, self.truncate, self.log = end_at, truncate, []

    def reset(self, seed=None):
        self.log.append(("reset", seed))
        self.turn = 0
        return "obs", {}

    def expert_action(self, rng, noise):
        return f"a{self.turn}:{noise}:{rng.random():.6f}"

    def step(self, action):
        self.log.append(("step", action))
        self.turn += 1
        end = self.end_at is not None and self.turn >= self.end_at
        return "obs", 0.0, end and not self.truncate, end and self.truncate, {}


def test_the_expert_is_noiseless_and_draws_from_a_generator_seeded_with_the_env_seed():
    env = ScriptedEnv()
    acts = expert_actions(env, 17, 3)
    rng = random.Random(17)
    assert acts == [f"a{t}:0.0:{rng.random():.6f}" for t in range(3)]  # max_turns actions when the game never ends
    assert env.log == [("reset", 17)] + [("step", a) for a in acts]


@pytest.mark.parametrize("truncate", [False, True])
def test_the_expert_stops_when_the_episode_ends(truncate):
    env = ScriptedEnv(end_at=2, truncate=truncate)
    assert len(expert_actions(env, 0, 5)) == 2
    assert len(expert_actions(ScriptedEnv(end_at=1, truncate=truncate), 0, 5)) == 1


def test_an_env_without_an_expert_is_named_in_the_error():
    class Plain:
        def reset(self, seed=None):
            return "", {}

    with pytest.raises(ConfigError, match=r"^config key 'env.init_resample_frac' needs an env with a scripted expert "
                                          r"\(expert_action\); Plain has none: expected env.init_resample_frac: 0$"):
        expert_actions(Plain(), 0, 3)


def test_anchors_cover_one_to_length_minus_one():
    experts = [["a", "b", "c", "d"]] * 300 + [["x", "y"]] * 50
    drawn = choose_prefixes(experts, [True] * 350, list(range(350)))
    assert {len(p) for p in drawn[:300]} == {1, 2, 3}
    assert all(p == ["a", "b", "c", "d"][:len(p)] for p in drawn[:300])
    assert drawn[300:] == [["x"]] * 50  # an expert of two turns: replay its first, play its last
    assert choose_prefixes([[]], [True], [0]) == [[]]
    # each draw is random.Random(seed).randint(1, L - 1)
    assert [len(p) for p in drawn[:20]] == [random.Random(s).randint(1, 3) for s in range(20)]
