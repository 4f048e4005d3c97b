"""Issue 57 A.1-A.2 on a real local Ray of 2 CPUs: queued reward work that no worker can take stops with an error
naming the role (it waited forever before), and workers that do not all fit are reported as placed / offered."""

from __future__ import annotations

import io
import logging
import os
import time

import pytest

from credo.distributed.ray.runtime import ClusterWorkerError, WorkerGroup
from tests.ray.fns import length_reward
from tests.ray.test_capacity import free_port

pytest.importorskip("ray")


class Idle:
    """A worker that only says it is ready (placement is all these tests look at)."""

    def ready(self) -> dict:
        return {"pid": os.getpid()}


@pytest.fixture(scope="module")
def ray2():
    """A local Ray of 2 CPUs started as a run starts it (`connect`, run.verbose off), what Ray logged in "log"."""
    import ray

    from credo.distributed.ray.config import ClusterConfig
    from credo.distributed.ray.runtime import connect
    from tests.ray.common import worker_env

    os.environ["PYTHONPATH"] = worker_env()["env_vars"]["PYTHONPATH"]  # the workers import this module
    os.environ.setdefault("RAY_worker_niceness", "0")
    text = io.StringIO()
    seen = logging.StreamHandler(text)  # every record Ray's loggers emit (its own handler holds pytest's stderr)
    logging.getLogger("ray").addHandler(seen)
    # A Ray address left in the environment (or in /tmp/ray/ray_current_cluster, which `ray start` and the
    # multi-node tests' ray.cluster_utils.Cluster write) must not turn cluster.address='' into a join: a bare
    # ray.init(num_cpus=...) joined it and failed "When connecting to an existing cluster, num_cpus ... must not
    # be provided" (CI, 2026-12-07, 15 Ray tests). Here it points at a port where no Ray answers.
    stale = f"127.0.0.1:{free_port()}"
    old = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = stale
    try:
        connect(ClusterConfig(engine="ray", num_cpus=2), verbose=False)
    finally:
        logging.getLogger("ray").removeHandler(seen)
        if old is None:
            os.environ.pop("RAY_ADDRESS")
        else:
            os.environ["RAY_ADDRESS"] = old
    yield {"log": text.getvalue(), "stale": stale}
    ray.shutdown()


def test_an_empty_address_starts_a_local_ray_whatever_address_was_recorded(ray2):
    import ray

    assert ray.get_runtime_context().gcs_address != ray2["stale"]
    assert ray.cluster_resources()["CPU"] == 2  # the Ray it started, with cluster.num_cpus


def test_waits_that_cannot_be_met_name_the_role_and_what_the_cluster_offers(ray2):
    from credo.distributed.ray.rewards import RayRewardWorker

    holders = WorkerGroup("rollout", Idle, resources={"CPU": 1}, max_restarts=0, startup_timeout_s=120)
    holders.start(2)  # the two rollout actors hold both CPUs: no reward task can start (a hang before)
    try:
        pool = RayRewardWorker(length_reward, timeout_s=5, workers=4, max_failure_frac=1.0, startup_timeout_s=3)
        t0 = time.monotonic()
        with pytest.raises(ClusterWorkerError, match=r"role 'reward': 4 reward task\(s\) asking for \{CPU: 1\} did "
                                                     r"not start within cluster.startup_timeout_s = 3 s; the cluster "
                                                     r"offers \{CPU: 2\} in all, \{CPU: 0\} free"):
            pool([(["a", "bb"], [0, 0])] * 6, step=0)
        assert time.monotonic() - t0 < 15
        more = WorkerGroup("judge", Idle, resources={"CPU": 1}, max_restarts=0, startup_timeout_s=2)
        with pytest.raises(ClusterWorkerError, match=r"role 'judge': 0 of 1 worker\(s\) asking for \{CPU: 1\} were "
                                                     r"placed and ready; the cluster offers \{CPU: 2\} in all, \{CPU: 0\} free"):
            more.start(1)
    finally:
        holders.close()


@pytest.mark.heavy
def test_more_workers_than_cpus_reports_how_many_were_placed(ray2):
    group = WorkerGroup("rollout", Idle, resources={"CPU": 1}, max_restarts=0, startup_timeout_s=40)
    with pytest.raises(ClusterWorkerError, match=r"role 'rollout': 2 of 3 worker\(s\) asking for \{CPU: 1\} "
                                                 r"were placed and ready; the cluster offers \{CPU: 2\} in all"):
        group.start(3)  # it said "3 worker(s) ... were not placed" when 2 of 3 were



def test_a_quiet_ray_start_prints_no_token_authentication_warning(ray2):
    assert "Token authentication" not in ray2["log"] and "token-auth" not in ray2["log"]


def test_start_up_checks_the_sum_over_roles_against_the_live_cluster(ray2):
    """What `open_cluster` runs after joining a cluster (the only check of a remote one's capacity)."""
    from credo.config import ConfigError, load_recipe
    from credo.train.cluster import check_live_capacity

    over = ["cluster.engine=ray", "cluster.address=auto", "cluster.rollout.workers=2"]
    with pytest.raises(ConfigError, match=r"'cluster.rollout.workers' = 2: .*\{CPU: 3\} in all.*offers \{CPU: 2\}"):
        check_live_capacity(load_recipe("recipes/quickstart.yaml", over))
    check_live_capacity(load_recipe("recipes/quickstart.yaml", [*over, "cluster.rollout.resources={CPU: 0.5}"]))
