"""Placement on Ray's multi-node test cluster: three nodes with different custom resources, every role's workers on the
node its resource request names (the node id read inside the worker), and a request no node offers refused fast
with an error naming the role."""

from __future__ import annotations

import functools
import time

import pytest

from credo.config import ConfigError
from credo.distributed.ray.config import ClusterConfig, RewardRoleConfig, RoleConfig, RolloutRoleConfig
from credo.distributed.ray.runtime import ClusterWorkerError, connect
from credo.families.multiturn.config import EnvRoleConfig
from tests.ray.common import tiny_policy, worker_env
from tests.ray.fns import FlakyGuess

pytest.importorskip("ray")


def node_id_of_caller(*_):
    import ray

    return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def three_nodes():
    import os

    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray's default 15 starves workers on a shared machine

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"train": 1},
                                                            "include_dashboard": False})
    nodes = {"train": cluster.head_node,
             "rollout": cluster.add_node(num_cpus=2, resources={"rollout_node": 2}),
             "reward": cluster.add_node(num_cpus=2, resources={"reward_node": 2})}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=worker_env(), logging_level="warning")
    yield {name: node.node_id for name, node in nodes.items()}
    ray.shutdown()
    cluster.shutdown()


def placed_config() -> ClusterConfig:
    return ClusterConfig(
        engine="ray", address="auto", startup_timeout_s=1800,  # a worker's imports take minutes on a loaded machine
        rollout=RolloutRoleConfig(workers=1, resources={"rollout_node": 1, "CPU": 0.5}),
        judge=RoleConfig(workers=1, resources={"rollout_node": 1, "CPU": 0.5}),
        reward=RewardRoleConfig(workers=2, resources={"reward_node": 0.5}),
        env=EnvRoleConfig(workers=1, resources={"reward_node": 1, "CPU": 0.25}))


def test_every_role_lands_on_the_node_it_asked_for(three_nodes, tmp_path):
    import ray

    from credo.distributed.ray.envs import RayEnvPool
    from credo.distributed.ray.rewards import RayRewardWorker
    from credo.distributed.ray.rollout import RayRolloutBackend

    cfg = placed_config()
    connect(cfg, roles=("rollout", "reward", "judge", "env"))  # joined already: only the placement check runs
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
    path, _, _ = tiny_policy(tmp_path)
    rollout = RayRolloutBackend.from_cluster(cfg, path)
    judge = RayRolloutBackend.from_cluster(cfg, path, role="judge")
    envs = RayEnvPool.from_cluster(cfg, functools.partial(FlakyGuess, low=1, high=7, max_turns=3), timeout_s=60)
    rewards = RayRewardWorker.from_cluster(cfg, node_id_of_caller, timeout_s=60, max_failure_frac=1.0)
    try:
        assert {i["node_id"] for i in rollout.worker_info().values()} == {three_nodes["rollout"]}
        assert {i["node_id"] for i in judge.worker_info().values()} == {three_nodes["rollout"]}
        assert {i["node_id"] for i in envs.worker_info().values()} == {three_nodes["reward"]}
        assert rewards.run_one(["x"], [0]) == ("ok", three_nodes["reward"])
        assert node_id_of_caller() == three_nodes["train"]  # the trainer (this driver) stays on the training node
    finally:
        rollout.close()
        judge.close()
        envs.close()


def test_a_resource_no_node_offers_is_refused_fast_naming_the_role(three_nodes):
    import ray

    cfg = placed_config()
    cfg.judge.resources = {"decode_gpu": 1}
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"cluster.judge.resources.*decode_gpu.*role 'judge' cannot be placed"):
        connect(cfg, roles=("rollout", "reward", "judge", "env"))
    cfg.judge.resources = {"rollout_node": 3}  # offered, but not that much on any one node
    with pytest.raises(ConfigError, match="role 'judge'"):
        connect(cfg, roles=("judge",))
    assert time.monotonic() - t0 < 5
    connect(cfg, roles=("rollout", "env"))  # the roles a run uses are the ones checked

    # past the check (another job took the room, say), a worker that cannot be placed is an error, not a hang
    from credo.distributed.ray.envs import RayEnvPool

    t0 = time.monotonic()
    with pytest.raises(ClusterWorkerError, match=r"role 'env'.*decode_gpu.*startup_timeout_s = 2"):
        RayEnvPool(functools.partial(FlakyGuess), resources={"decode_gpu": 1}, startup_timeout_s=2)
    assert time.monotonic() - t0 < 30
    assert ray.is_initialized()
