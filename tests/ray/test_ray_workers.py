"""Reward, judge and env workers on a real local Ray: the same results as the in-process workers (failures and
timeouts isolated and counted alike), the reward pool growing with its queue, and a worker of each role killed
mid-call replaced with its work redone, so the result equals the unfaulted run's."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import pytest

from credo.distributed.ray.runtime import ClusterWorkerError, cluster_metrics
from credo.distributed.rollout import HFBackend
from credo.rewards.worker import RewardWorker
from credo.families.multiturn.source import MultiTurnRollout
from credo.families.multiturn.resample import expert_actions
from tests.multiturn.common import env_cfg
from tests.ray.common import start_local_ray, tiny_policy
from tests.ray.fns import DiesOnce, DiesStarting, DyingGuess, FlakyGuess, always_dies, length_reward

pytest.importorskip("ray")

GROUPS = [(["ab", "c"], [0, 0]), (["raise", "x"], [1, 1]), (["abcd", ""], [2, 2]), (["hang", "y"], [3, 3]),
          (["q", "rst"], [4, 4]), (["uvwxy", "z"], [5, 5])]


@pytest.fixture(scope="module")
def ray_local():
    ray = start_local_ray(num_cpus=4)
    yield ray
    ray.shutdown()


def as_tuple(res):
    return res.rewards, res.valid, res.failures, res.timeouts


def test_the_reward_pool_scores_like_the_local_worker_and_grows_with_its_queue(ray_local):
    from credo.distributed.ray.rewards import RayRewardWorker

    local = RewardWorker(length_reward, timeout_s=2.0, workers=2, max_failure_frac=1.0)
    pool = RayRewardWorker(length_reward, timeout_s=2.0, workers=3, max_failure_frac=1.0, resources={"CPU": 0.5})
    want = as_tuple(local(GROUPS, step=0))
    # the raising group is retried sample by sample (only "raise" fails); the hung group's two samples time out
    assert want[2:] == (1, 2) and want[1] == [True, True, False, True, True, True, False, False] + [True] * 4
    assert want[0][:4] == [2.0, 1.0, 0.0, 1.0]
    t0 = time.monotonic()
    got = pool(GROUPS, step=0)
    assert as_tuple(got) == want
    assert time.monotonic() - t0 < 90  # the hung call cost its timeout, not its 120 s (33.8 s seen at load 50)
    m = pool.metrics()
    assert m["cluster/reward_workers"] == 3 and m["cluster/reward_queue_depth"] == 3  # 6 calls, at most 3 at once
    assert m["cluster/reward_restarts"] == 0
    status, value = pool.run_one(["raise"], [0])
    assert status == "error" and isinstance(value, ValueError) and "verifier broke" in str(value)
    local.close()


def test_a_reward_worker_killed_mid_call_is_redone_and_one_that_keeps_dying_names_the_role(ray_local, tmp_path):
    from credo.distributed.ray.rewards import RayRewardWorker

    marker = tmp_path / "die-once"
    marker.touch()
    calm = [g for g in GROUPS if g[0][0] not in ("hang",)]
    want = as_tuple(RayRewardWorker(length_reward, timeout_s=20.0, workers=2, max_failure_frac=1.0,
                                    resources={"CPU": 0.5})(calm, step=1))
    pool = RayRewardWorker(DiesOnce(str(marker)), timeout_s=20.0, workers=2, max_failure_frac=1.0,
                           resources={"CPU": 0.5}, max_restarts=1)
    assert as_tuple(pool(calm, step=1)) == want
    assert not marker.exists() and pool.metrics()["cluster/reward_restarts"] == 1
    doomed = RayRewardWorker(always_dies, timeout_s=20.0, workers=1, max_failure_frac=1.0, resources={"CPU": 0.5},
                             max_restarts=1)
    with pytest.raises(ClusterWorkerError, match="role 'reward'.*max_restarts = 1"):
        doomed(calm[:1], step=1)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return tiny_policy(tmp_path_factory.mktemp("ray-judge"), seed=1)


def test_a_judge_pool_generates_like_the_local_judge_and_survives_a_killed_worker(ray_local, judge):
    from credo.distributed.ray.rollout import RayRolloutBackend
    from credo.families.judges.reward import JudgeReward

    path, model, tok = judge
    kw = dict(group_size=2, mode="pointwise", template=None, max_new_tokens=24, temperature=0.8, seed=3)
    prompts = [f"[Question]\n{a}+{b}=\n[Response]\n{a + b}\nScore:" for a in range(12) for b in (3, 40)]
    want = JudgeReward(HFBackend(model, tok, per_sample_seeds=True), tok, tok, **kw).generate(prompts, step=5)
    backend = RayRolloutBackend(path, role="judge", workers=2, resources={"CPU": 0.5}, max_restarts=1)
    try:
        reward = JudgeReward(backend, tok, tok, **kw)
        assert reward.generate(prompts, step=5) == want
        result = {}
        call = threading.Thread(target=lambda: result.update(out=reward.generate(prompts * 4, step=5)))
        call.start()
        t0 = time.monotonic()
        while len(backend.running) < 2:
            assert time.monotonic() - t0 < 60
            time.sleep(0.01)
        os.kill(backend.worker_info()[backend.active[1]]["pid"], signal.SIGKILL)
        call.join(120)
        want4 = JudgeReward(HFBackend(model, tok, per_sample_seeds=True), tok, tok, **kw).generate(prompts * 4, step=5)
        assert result["out"] == want4
        m = cluster_metrics(backend.metrics())
        assert m["cluster/judge_restarts"] == 1 and m["cluster/worker_restarts"] == 1
    finally:
        backend.close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_policy(tmp_path_factory.mktemp("ray-env-policy"))


def play(policy, env_factory, step: int):
    """One step of the multi-turn source (4 games x 2 episodes) with a real tiny policy on `env_factory`'s envs."""
    _, model, tok = policy
    cfg = env_cfg(kwargs={"low": 1, "high": 7, "max_turns": 3}, step_timeout_s=60.0, max_failure_frac=1.0,
                  max_new_tokens_per_turn=3)
    src = MultiTurnRollout(cfg, tok, HFBackend(model, tok), seed=4, prompts_per_step=4, group_size=2, temperature=1.0,
                           top_p=1.0, env_factory=env_factory)
    batch = src.rollout(step)
    rows = [(s.response_ids, s.response_mask, {k: v for k, v in s.meta.items() if k != "error"}) for s in batch.samples]
    metrics = {k: v for k, v in batch.metrics.items() if not k.startswith("perf/")}
    return rows, metrics, [s.meta["error"] for s in batch.samples]


def test_envs_on_actors_play_like_local_envs_through_the_unchanged_multiturn_source(ray_local, policy, tmp_path):
    from credo.distributed.ray.envs import RayEnvPool

    make = functools.partial(FlakyGuess, low=1, high=7, max_turns=3)
    pool = RayEnvPool(make, workers=2, resources={"CPU": 0.25}, max_restarts=1)
    try:
        seen = {"failures": 0, "multi_turn": 0}
        for step in (1, 2):
            want, want_metrics, want_errors = play(policy, make, step)
            got, got_metrics, got_errors = play(policy, pool.make_env, step)
            assert got == want and got_metrics == want_metrics
            assert [e is None for e in got_errors] == [e is None for e in want_errors]
            seen["failures"] += want_metrics["env/failures"]
            seen["multi_turn"] += sum(len(r[2]["turn_spans"]) > 1 for r in want)
        assert seen["failures"] > 0 and seen["multi_turn"] > 0  # failed and multi-turn episodes both compared
        assert {i["node_id"] for i in pool.worker_info().values()} and pool.metrics()["cluster/env_busy_frac"] > 0
        # the scripted expert (IPA's resampling) through a proxy: its RNG state travels both ways
        assert expert_actions(pool.make_env(), 12, 3) == expert_actions(make(), 12, 3)
    finally:
        pool.close()

    # an env worker killed mid-step: replaced, every episode on it replayed, the step's result unchanged
    marker = tmp_path / "env-dies-once"
    marker.touch()
    dying = RayEnvPool(functools.partial(FlakyGuess, marker=str(marker), low=1, high=7, max_turns=3), workers=2,
                       resources={"CPU": 0.25}, max_restarts=1)
    try:
        got, got_metrics, _ = play(policy, dying.make_env, 2)
        assert got == want and got_metrics == want_metrics
        assert not marker.exists() and dying.metrics()["cluster/env_restarts"] == 1
    finally:
        dying.close()

    # an env worker that keeps dying: the role's error, raised again by the pool so the source's next step stops
    doomed = RayEnvPool(functools.partial(DyingGuess, low=1, high=7, max_turns=3), resources={"CPU": 0.25},
                        max_restarts=0)
    try:
        env = doomed.make_env()
        env.reset(seed=1)
        with pytest.raises(ClusterWorkerError, match="role 'env'.*max_restarts = 0"):
            env.step("4")
        with pytest.raises(ClusterWorkerError, match="role 'env'"):
            doomed.make_env()
    finally:
        doomed.close()


def kill_worker(pool, slot: int = 0) -> None:
    """SIGKILL the env actor process in `slot` and wait until it is gone (the next call then sees a lost worker)."""
    pid = pool.worker_info()[slot]["pid"]
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
        assert time.monotonic() - t0 < 30, "the killed env worker did not exit"
        time.sleep(0.01)


def test_a_replacement_that_dies_while_starting_is_one_more_restart_up_to_the_cap(ray_local, tmp_path):
    """An env worker killed mid-episode whose first replacement dies in its constructor: two restarts counted, the
    episode replayed on the second replacement and going on exactly as the local env's; with a cap of one, the
    replacement's death is the role's error, naming it and the cause."""
    from credo.distributed.ray.envs import RayEnvPool

    kw = dict(low=1, high=7, max_turns=6)
    local = DiesStarting(**kw)
    actions = ["3", "5", "2", "6"]
    want = [local.reset(seed=11)] + [local.step(a) for a in actions]

    marker = tmp_path / "replacement-dies"
    pool = RayEnvPool(functools.partial(DiesStarting, marker=str(marker), **kw), resources={"CPU": 0.25},
                      max_restarts=2)
    try:
        env = pool.make_env()
        got = [env.reset(seed=11), env.step(actions[0]), env.step(actions[1])]
        first_pid = pool.worker_info()[0]["pid"]
        marker.touch()  # the next env worker to start dies in its constructor
        kill_worker(pool)
        got += [env.step(a) for a in actions[2:]]
        assert got == want
        assert not marker.exists() and pool.worker_info()[0]["pid"] != first_pid
        assert pool.group.restarts == 2 and pool.metrics()["cluster/env_restarts"] == 2
    finally:
        pool.close()

    capped = RayEnvPool(functools.partial(DiesStarting, marker=str(marker), **kw), resources={"CPU": 0.25},
                        max_restarts=1)
    try:
        env = capped.make_env()
        env.reset(seed=11)
        marker.touch()
        kill_worker(capped)
        with pytest.raises(ClusterWorkerError, match=r"role 'env'.*max_restarts = 1.*replacement died while starting"):
            env.step("3")
        assert not marker.exists() and capped.group.restarts == 2
    finally:
        capped.close()
