"""Env failures: a raising and a hanging env end their own episodes only, are masked and counted; a failure
fraction above the cap stops the run naming the env; an observation that overflows the context truncates."""

import time

import pytest
import torch

from credo.families.multiturn.envs.guess import GuessNumberEnv
from credo.train.batch import pack_batch
from credo.families.multiturn.source import EnvFailureError, EnvReward
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


def test_a_turn_that_does_not_fit_ends_the_episode_as_max_total_tokens():
    src, _, _ = source(env_cfg(), policy, P=1, G=1)
    prompt_len = len(src.rollout(step=1).samples[0].prompt_ids)
    # room for one token after the prompt: the first action ("4" + EOS) does not fit
    src, _, _ = source(env_cfg(max_total_tokens=prompt_len + 1), policy, P=1, G=1)
    batch = src.rollout(step=1)
    s = batch.samples[0]
    assert s.meta["end"] == "max_total_tokens" and s.meta["truncated"] and not s.meta["failed"]
    assert len(s.response_ids) == 1 and s.meta["turn_rewards"] == [0.0]
    assert batch.metrics["env/overflow_frac"] == 1.0


def test_episode_ends_map_to_terminated_truncated_failed():
    from credo.families.multiturn.source import Episode

    flags = {end: [Episode(env=None, env_seed=0, end=end).sample([1]).meta[k] for k in ("terminated", "truncated",
                                                                                        "failed")]
             for end in ("terminated", "env_truncated", "max_turns", "max_total_tokens", "failed")}
    assert flags == {"terminated": [True, False, False], "env_truncated": [False, True, False],
                     "max_turns": [False, True, False], "max_total_tokens": [False, True, False],
                     "failed": [False, False, True]}


def test_a_replayed_prefix_fails_on_a_timeout_or_an_ended_game():
    import threading

    from credo.families.multiturn.episodes import Episode, replay_prefix

    release = threading.Event()

    class Hanging(FixedTarget):
        def step(self, action):
            release.wait(30)
            return super().step(action)

    class TruncatesAtOnce(FixedTarget):
        def step(self, action):
            obs, r, _, _, info = super().step(action)
            return obs, r, False, True, info

    src, _, _ = source(env_cfg(step_timeout_s=0.2), policy, P=1, G=1)
    try:
        for env, timeouts in ((Hanging(5, low=1, high=7, max_turns=3), 1),
                              (TruncatesAtOnce(5, low=1, high=7, max_turns=3), 0)):
            env.reset(seed=0)
            e = Episode(env=env, env_seed=0, prefix_actions=["4"])
            assert replay_prefix(e, src.tokenizer, src.observation, 0.2) == (False, timeouts)
            assert e.end == "failed" and e.error.startswith("prefix step 0: ")
        env = FixedTarget(5, low=1, high=7, max_turns=3)
        env.reset(seed=0)
        ok = Episode(env=env, env_seed=0, prefix_actions=["4"])
        assert replay_prefix(ok, src.tokenizer, src.observation, 0.2) == (True, 0) and ok.end is None
    finally:
        release.set()


def test_evaluation_generate_samples_without_nucleus_truncation():
    seen = {}

    class Recording:
        def generate(self, prompts, **kw):
            seen.update(kw)
            return []

    src, _, _ = source(env_cfg(max_new_tokens_per_turn=3), policy, backend=Recording())
    src.generate([[1, 2]], temperature=0.5, seeds=[7])
    assert seen == {"max_new_tokens": 3, "temperature": 0.5, "top_p": 1.0, "seeds": [7]}


def test_call_with_deadline_reports_ok_error_and_timeout():
    from credo.families.multiturn.source import call_with_deadline

    release = __import__("threading").Event()
    boom = ZeroDivisionError("no")

    def raising():
        raise boom

    try:
        out = call_with_deadline([lambda: 7, raising, lambda: release.wait(30)], 0.2)
    finally:
        release.set()
    assert out == [("ok", 7), ("error", boom), ("timeout", None)]


def test_rollout_rate_is_over_the_rollouts_own_time():
    src, _, _ = source(env_cfg(), policy, P=2, G=2)
    t0 = time.perf_counter()
    batch = src.rollout(step=1)
    wall = time.perf_counter() - t0
    assert wall < 1.0  # a scripted backend: the rate's floor of 1e-9 s is not what divides here
    assert 4 / wall <= batch.metrics["perf/episodes_per_s"] < float("inf")


def test_evaluation_is_greedy_at_temperature_0_and_seeded_otherwise(monkeypatch):
    from credo.families.multiturn.source import EVAL_SEED_BASE, step_seed

    src, _, _ = source(env_cfg(), policy)
    calls = []
    run = src.run_episodes

    def recording(env_seeds, **kw):
        calls.append((list(env_seeds), kw))
        return run(env_seeds, **kw)

    monkeypatch.setattr(src, "run_episodes", recording)
    assert src.evaluate(2, temperature=0, seed=3) == 1.0  # 4, 6, then 5: the return 1 of the last turn
    assert src.evaluate(2, temperature=0.5, seed=3) == 1.0
    seeds = [EVAL_SEED_BASE, EVAL_SEED_BASE + 1]
    assert calls == [(seeds, {"temperature": 1.0, "top_p": 1.0, "sample_seeds": None, "envs": None}),
                     (seeds, {"temperature": 0.5, "top_p": 1.0, "sample_seeds": [step_seed(3, -1, i) for i in (0, 1)],
                              "envs": None})]  # envs: None = a fresh env per episode (a subclass may prepare them)


def test_multiturn_source_takes_the_ranks_share_and_syncs_the_backend():
    from types import SimpleNamespace

    from credo.models import build_char_tokenizer
    from credo.tasks.render import plain_prompt
    from credo.families.multiturn.source import multiturn_source
    from tests.multiturn.common import FixedTarget, ScriptedBackend

    tok = build_char_tokenizer()
    backend = ScriptedBackend(tok, policy)
    ctx = SimpleNamespace(section=env_cfg(), tokenizer=tok, backend=backend, seed=0, rank=1, world=2, render=plain_prompt,
                          rollout=dict(prompts_per_step=4, group_size=2, temperature=1.0, top_p=1.0,
                                       env_factory=lambda: FixedTarget(5, low=1, high=7, max_turns=3)))
    src = multiturn_source(ctx)
    batch = src.rollout(step=1)
    assert batch.group_ids.tolist() == [2, 2, 3, 3]  # rank 1 of 2 plays games 2 and 3 of 4
    src.sync(None, 9)
    assert backend.version == 9
