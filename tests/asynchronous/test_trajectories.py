"""Trajectory-level asynchrony of the multi-turn source (env.trajectory_async): with a policy that answers the same
context the same way, it plays exactly the turn-synchronous episodes, without the per-turn barrier (a slow env step
delays only its own episode); a hung env fails only its episode; and the built-in games' simulated latency."""

from __future__ import annotations

import math
import statistics
import time

import pytest

from credo.families.multiturn.envs.guess import GuessNumberEnv
from credo.families.multiturn.envs.latency import SimulatedLatency
from credo.families.multiturn.task import EnvTask
from tests.multiturn.common import FixedTarget, HangingEnv, env_cfg, source


def guess_from_context(text: str) -> str:
    """A deterministic policy: binary search over what the feedback in the context leaves (as the expert plays)."""
    lo, hi = 1, 7
    for line in text.split("\n"):
        guess = (lo + hi) // 2
        if "higher" in line:
            lo = guess + 1
        elif "lower" in line:
            hi = guess - 1
    return str((lo + hi) // 2)


class SlowTurns(FixedTarget):
    """Target 7 (three turns of binary search); one episode in four is slow on each turn, a different one each turn."""

    slow_s = 0.6
    made = 0

    def __init__(self):
        super().__init__(7, low=1, high=7, max_turns=3)
        self.index, SlowTurns.made = SlowTurns.made, SlowTurns.made + 1

    def step(self, action):
        if (self.index + self.turn) % 4 == 0:
            time.sleep(self.slow_s)
        return super().step(action)


def play(trajectory_async: bool, envs, P=4, G=2, **cfg):
    src, backend, _ = source(env_cfg(trajectory_async=trajectory_async, **cfg), guess_from_context, envs=envs, P=P, G=G)
    t = time.perf_counter()
    batch = src.rollout(1)
    return batch, time.perf_counter() - t, backend.calls


def episodes(batch) -> list:
    return [(s.prompt_ids, s.response_ids, s.response_mask, s.meta["turn_rewards"], s.meta["end"],
             s.meta["actions"]) for s in batch.samples]


@pytest.mark.slow
def test_trajectories_are_the_turn_synchronous_episodes_without_the_per_turn_barrier():
    SlowTurns.made = 0
    sync, sync_s, sync_calls = play(False, SlowTurns)
    SlowTurns.made = 0
    traj, traj_s, traj_calls = play(True, SlowTurns)
    assert episodes(traj) == episodes(sync)
    assert all(s.meta["end"] == "terminated" and len(s.meta["actions"]) == 3 for s in traj.samples)
    # synchronous: every turn waits for its slow episode (3 x 0.6 s); trajectory level: each episode is slow once
    assert sync_s > 3 * SlowTurns.slow_s and traj_s < 0.75 * sync_s, (sync_s, traj_s)
    assert sync_calls == [8, 8, 8]
    assert sum(traj_calls) == 24 and len(traj_calls) > 3  # the same turns, in calls of whoever is ready
    assert traj.metrics["perf/episodes_per_s"] > sync.metrics["perf/episodes_per_s"]


def test_a_hung_env_fails_only_its_episode_at_its_deadline():
    HangingEnv.release.clear()
    made = []

    def envs():
        made.append(1)
        return HangingEnv(5, low=1, high=7, max_turns=3) if len(made) == 1 else FixedTarget(5, low=1, high=7,
                                                                                             max_turns=3)
    try:
        batch, seconds, _ = play(True, envs, P=2, G=2, step_timeout_s=0.5, max_failure_frac=0.5)
    finally:
        HangingEnv.release.set()
    ends = [s.meta["end"] for s in batch.samples]
    assert ends[0] == "failed" and "timeout" in batch.samples[0].meta["error"]
    assert ends[1:] == ["terminated"] * 3 and seconds < 5
    assert batch.metrics["env/timeouts"] == 1 and batch.metrics["env/failures"] == 1


def test_simulated_latency_is_log_normal_with_the_median_and_sigma_asked_and_fixed_by_the_seed():
    lat = SimulatedLatency(2e-4, 0.8)
    lat.reset(seed=11)
    draws = [lat.wait() for _ in range(1500)]
    logs = [math.log(d) for d in draws]
    assert statistics.median(draws) == pytest.approx(2e-4, rel=0.1)
    assert statistics.pstdev(logs) == pytest.approx(0.8, rel=0.1)
    lat.reset(seed=11)
    assert [lat.wait() for _ in range(5)] == draws[:5]
    assert SimulatedLatency(0.0).wait() == 0.0


def test_the_built_in_games_sleep_their_latency_and_the_warm_up_demonstrations_do_not():
    env = GuessNumberEnv(latency_s=0.05, latency_sigma=0.0)  # sigma 0: exactly the median
    env.reset(seed=3)
    t = time.perf_counter()
    env.step("4")
    assert time.perf_counter() - t >= 0.05
    cfg = env_cfg(kwargs={"low": 1, "high": 7, "max_turns": 3, "latency_s": 5.0})
    plain = env_cfg()
    t = time.perf_counter()
    with_latency = EnvTask(cfg, None, lambda o: o, lambda o: f"\n{o}\n").train(0)
    assert time.perf_counter() - t < 1.0
    assert with_latency == EnvTask(plain, None, lambda o: o, lambda o: f"\n{o}\n").train(0)
