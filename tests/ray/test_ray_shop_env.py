"""The shop env (credo:Shop-v0-tiny) on Ray env workers (cluster.engine: ray, role env) plays exactly as in process:
the same observations, rewards, ends and episode metrics for a noisy scripted expert's episodes (issue 35)."""

from __future__ import annotations

import random

import pytest

from credo.families.multiturn.envs import BUILTIN_ENVS
from tests.ray.common import start_local_ray

pytest.importorskip("ray")


def episode(env, seed: int, noise: float) -> list:
    """One episode driven by the env's scripted expert with `noise` random calls: every step's output."""
    obs, _ = env.reset(seed=seed)
    trace, rng = [obs], random.Random(seed)
    for _ in range(12):
        action = env.expert_action(rng, noise)
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((action, obs, reward, terminated, truncated, info.get("episode_metrics")))
        if terminated or truncated:
            break
    return trace


def test_the_shop_env_on_ray_env_workers_plays_like_the_local_env():
    from credo.distributed.ray.envs import RayEnvPool

    ray = start_local_ray(num_cpus=2)
    make = BUILTIN_ENVS["credo:Shop-v0-tiny"]
    pool = RayEnvPool(make, workers=2, resources={"CPU": 0.25}, max_restarts=1)
    try:
        for seed, noise in ((3, 0.0), (4, 0.5), (11, 1.0)):
            want = episode(make(), seed, noise)
            got = episode(pool.make_env(), seed, noise)
            assert got == want
            assert want[-1][3] or want[-1][4]  # each compared episode ran to its end
        assert any(step[2] > 0 for step in episode(make(), 3, 0.0)[1:])  # the noiseless expert's episode is paid
        assert pool.metrics()["cluster/env_busy_frac"] > 0
    finally:
        pool.close()
        ray.shutdown()
