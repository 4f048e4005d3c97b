"""Env failures: a raising and a hanging env end their own episodes only, are masked and counted; a failure
fraction above the cap stops the run naming the env; an observation that overflows the context truncates."""

import time

import pytest
import torch

from credo.envs.guess import GuessNumberEnv
from credo.train.batch import pack_batch
from credo.train.multiturn import EnvFailureError, EnvReward
from tests.multiturn.common import FixedTarget, HangingEnv, RaisingEnv, env_cfg, source


def mixed_envs(kinds):
    it = iter(kinds)
    return lambda: next(it)(5, low=1, high=7, max_turns=3)


def policy(context):  # 4 -> higher, 6 -> lower, 5 -> correct
    return ["4", "6", "5"][context.count("<eos>")]


def test_raising_and_hanging_envs_end_only_their_episodes():
    HangingEnv.release.clear()
    cfg = env_cfg(step_timeout_s=0.5, max_failure_frac=0.5)
    src, backend, tok = source(cfg, policy, envs=mixed_envs([FixedTarget, RaisingEnv, HangingEnv, FixedTarget]),
                               P=2, G=2)
    t0 = time.monotonic()
    try:
        batch = src.rollout(step=1)
    finally:
        HangingEnv.release.set()
    # the hang costs one deadline (0.5 s), not the 60 s it would take
    assert time.monotonic() - t0 < 10
    ends = [s.meta["end"] for s in batch.samples]
    assert ends == ["terminated", "failed", "failed", "terminated"]
    assert "the env crashed" in batch.samples[1].meta["error"] and "timeout" in batch.samples[2].meta["error"]
    assert [s.meta["turn_rewards"] for s in (batch.samples[0], batch.samples[3])] == [[0.0, 0.0, 1.0]] * 2
    assert batch.metrics["env/failures"] == 2 and batch.metrics["env/timeouts"] == 1
    assert backend.calls == [4, 2, 2]  # the failed episodes drop out after turn 0
    EnvReward()(batch)
    pack_batch(batch, tok.pad_token_id, overlong_filter=False)
    assert batch.valid.tolist() == [True, False, False, True]
    assert not batch.loss_mask[1].any() and not batch.loss_mask[2].any() and batch.loss_mask[0].any()


def test_failure_fraction_above_the_cap_names_the_env():
    cfg = env_cfg(max_failure_frac=0.25)
    src, _, _ = source(cfg, policy, envs=mixed_envs([FixedTarget, RaisingEnv, RaisingEnv, FixedTarget]), P=2, G=2)
    with pytest.raises(EnvFailureError, match=r"env 'credo:GuessNumber-v0': 2 of 4 episodes failed at step 7 "
                                              r"\(more than env.max_failure_frac = 0.25\)"):
        src.rollout(step=7)


def test_a_raising_reset_fails_its_episode():
    class BadReset(FixedTarget):
        def reset(self, seed=None):
            raise ValueError("no board")

    src, backend, _ = source(env_cfg(), policy, envs=mixed_envs([BadReset, FixedTarget]), P=1, G=2)
    batch = src.rollout(step=1)
    assert [s.meta["end"] for s in batch.samples] == ["failed", "terminated"]
    assert batch.samples[0].response_ids == [] and len(batch.samples[0].prompt_ids) == 1
    assert backend.calls == [1, 1, 1]


def test_an_observation_that_overflows_the_context_truncates_the_episode():
    class Verbose(FixedTarget):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs * 40, r, term, trunc, info

    cfg = env_cfg(max_total_tokens=60)
    src, _, tok = source(cfg, policy, envs=mixed_envs([Verbose, FixedTarget]), P=1, G=2)
    batch = src.rollout(step=1)
    s = batch.samples[0]
    assert s.meta["end"] == "max_total_tokens" and s.meta["truncated"] and not s.meta["failed"]
    assert len(s.prompt_ids) + len(s.response_ids) <= 60 and s.response_mask == [1, 1]
    assert batch.metrics["env/overflow_frac"] == 0.5 and batch.metrics["env/failures"] == 0
    EnvReward()(batch)
    assert batch.valid.tolist() == [True, True]


def test_unparsable_actions_get_the_envs_penalty_not_an_exception():
    env = GuessNumberEnv()
    env.reset(seed=0)
    assert env.step("no idea")[1:4] == (-0.1, True, False)
    env.reset(seed=0)
    assert env.step("99")[:4] == ("out of range", 0.0, False, False)
