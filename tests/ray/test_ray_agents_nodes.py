"""Agents on another Ray node (heavy: a two-node `ray.cluster_utils.Cluster` start): with a joined cluster the gateway
binds the node's address (`gateway_host`), and agent tasks placed by a custom label on the second node reach it
there with the run's key; their calls are recorded as usual."""

from __future__ import annotations

import pytest

from tests.gateway.common import MODEL, one_thread, untrained_policy
from tests.ray.common import worker_env

pytest.importorskip("ray")
pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def two_nodes():
    import os

    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_worker_niceness", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    agents = cluster.add_node(num_cpus=1, resources={"agent_node": 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=worker_env(), logging_level="warning")
    yield cluster, agents.node_id
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.heavy  # a two-node cluster's start: 30 s or more on the shared 2-core machine
def test_agents_on_a_second_node_reach_the_gateway_on_the_node_address(two_nodes, tmp_path):
    import ray

    from credo.distributed.ray.agents import RayAgentRunner, gateway_host
    from credo.distributed.ray.config import ClusterConfig
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler

    cluster, agent_node = two_nodes
    host = gateway_host(ClusterConfig(engine="ray", address=cluster.address))
    assert host == ray.util.get_node_ip_address() and host not in ("0.0.0.0", "")
    log = tmp_path / "nodes.log"
    with one_thread():
        model, tok = untrained_policy()
        with Gateway(backend_sampler(HFBackend(model, tok)), tok, model_name=MODEL, max_tokens=8, host=host) as gw:
            runner = RayAgentRunner(resources={"agent_node": 1, "CPU": 0.25})
            results = runner.run("tests.ray.agent_fns:on_node", [{"seed": i, "log": str(log)} for i in range(3)], gw,
                                 model=MODEL, max_concurrent=3, timeout_s=300, prefix="far")
            requests = gw.store.counters["gateway/requests"]
    assert [r.error for r in results] == [None] * 3 and [r.reward for r in results] == [1.0] * 3
    assert requests == 3 and all(r.trajectories for r in results)
    assert set(log.read_text().split()) == {agent_node}  # every agent ran on the second node
    assert agent_node != ray.get_runtime_context().get_node_id()  # not the driver's (the head's) node
