"""The gateway over the Ray rollout pool, and agents on Ray workers (agent.placement: ray,
credo.distributed.ray.agents). A gateway sampling through a `RayRolloutBackend` (one worker, one RNG stream per call,
as the local backend) with its agents as Ray tasks gives the trajectories of a local backend with agents in threads,
before and after a weight push. A scripted agent run as Ray tasks gives
the trajectories and rewards the same agent gives in threads (the gateway seeds sampling by episode id); an agent
that raises and one that hangs past its timeout each fail only their own episode, counted as in threads (the hung
one's worker process killed, its episode closed), the rest of the step going on; at most max_concurrent at once; a
gateway on the node's address (the multi-node rule) serves the workers and refuses requests without the key."""

from __future__ import annotations

import os
import time

import pytest

from tests.gateway.common import MODEL, one_thread, untrained_policy
from tests.ray.common import start_local_ray

pytest.importorskip("ray")
pytest.importorskip("openai")
pytest.importorskip("uvicorn")

AGENT = "tests.ray.agent_fns:scripted"


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray = start_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    with one_thread():
        yield untrained_policy()


def gateway(policy, **kw):
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler

    model, tok = policy
    return Gateway(backend_sampler(HFBackend(model, tok)), tok, model_name=MODEL, max_tokens=8, **kw)


def view(results) -> list:
    """Everything an episode gives the trainer: reward, named rewards, error, and each trajectory's tokens, mask,
    log-probs and meta (the turn spans, calls, rewards)."""
    return [(r.episode, r.reward, r.rewards, r.error,
             [(t.prompt_ids, t.response_ids, t.response_mask, t.rollout_log_probs, t.policy_version, t.finished,
               t.meta) for t in r.trajectories]) for r in results]


def test_agents_on_ray_tasks_give_the_trajectories_and_rewards_of_threads(policy, tmp_path):
    from credo.distributed.ray.agents import RayAgentRunner
    from credo.gateway.agents import run_episodes

    tasks = [{"seed": s, "kind": "named" if s == 3 else "ok"} for s in range(5)]
    with one_thread():
        with gateway(policy) as gw:
            threads = run_episodes(AGENT, tasks, gw, model=MODEL, max_concurrent=3, timeout_s=120, prefix="s0-step1")
        runner = RayAgentRunner(resources={"CPU": 0.25})
        log = str(tmp_path / "agents.log")
        with gateway(policy) as gw:
            on_ray = runner.run(AGENT, [{**t, "log": log} for t in tasks], gw, model=MODEL, max_concurrent=3,
                                timeout_s=120, prefix="s0-step1")
            counters = dict(gw.store.counters)
    for r in on_ray:
        r.task.pop("log")
    assert view(on_ray) == view(threads)
    events = [line.split() for line in open(log).read().splitlines()]
    assert len({pid for _, pid, _ in events}) >= 1 and _peak(events) <= 3  # agent.max_concurrent, on the workers
    assert [r.reward for r in on_ray] == [0.0, 0.5, 1.0, 1.0 - 1.75, 0.5]
    assert all(r.error is None and r.trajectories for r in on_ray)
    # three sampled turns each (a drift split spreads them over trajectories, as it does in threads)
    assert all(sum(len(t.meta["turn_rewards"]) for t in r.trajectories) == 3 for r in on_ray)
    assert counters["gateway/requests"] == 15 and counters.get("gateway/agent_failures", 0) == 0
    m = runner.metrics()
    assert 1 <= m["cluster/agent_workers"] <= 3 and m["cluster/agent_restarts"] == 0


def test_the_gateway_over_the_ray_rollout_pool_with_ray_agents_gives_the_local_trajectories(tmp_path):
    """Both halves of item 6 at once: the Ray pool behind the gateway (backend_sampler over RayRolloutBackend) and
    the agents on Ray tasks, against HFBackend on the trainer's module with agents in threads; then a real Adam step
    pushed to the worker (sync_weights), and the same again at policy version 1."""
    from credo.distributed.ray.agents import RayAgentRunner
    from credo.distributed.ray.rollout import RayRolloutBackend
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler
    from credo.gateway.agents import run_episodes
    from tests.ray.common import tiny_policy, train_step

    path, model, tok = tiny_policy(tmp_path)
    tasks = [{"seed": s} for s in range(4)]
    pool = RayRolloutBackend(path, workers=1, resources={"CPU": 0.5}, per_sample_seeds=False, threads=1)
    runner = RayAgentRunner()
    try:
        with one_thread():
            local_backend = HFBackend(model, tok)
            for version in (0, 1):
                if version:
                    train_step(model, tok)
                    local_backend.sync_weights(model, version)
                    pool.sync_weights(model, version)
                with Gateway(backend_sampler(local_backend), tok, model_name=MODEL, max_tokens=8) as gw:
                    local = run_episodes(AGENT, tasks, gw, model=MODEL, max_concurrent=2, timeout_s=120,
                                         prefix="p")  # the same seeds at both versions
                with Gateway(backend_sampler(pool), tok, model_name=MODEL, max_tokens=8) as gw:
                    on_ray = runner.run(AGENT, tasks, gw, model=MODEL, max_concurrent=2, timeout_s=120,
                                        prefix="p")  # the same seeds at both versions
                assert view(on_ray) == view(local)
                assert all(t.policy_version == version for r in on_ray for t in r.trajectories)
                assert len({tuple(t.response_ids) for r in on_ray for t in r.trajectories}) > 1  # the draws vary
                if version == 0:
                    before = view(local)
        assert view(local) != before  # the pushed step changed what was sampled
    finally:
        pool.close()


def test_a_raising_and_a_hanging_agent_on_ray_fail_only_their_episodes(policy, tmp_path):
    from credo.distributed.ray.agents import RayAgentRunner
    from credo.gateway.agents import run_episodes

    log = str(tmp_path / "agents.log")
    kinds = ["ok", "raises", "hangs", "ok", "ok"]
    tasks = [{"seed": i, "kind": k, "log": log} for i, k in enumerate(kinds)]
    with one_thread():
        runner = RayAgentRunner(resources={"CPU": 0.25})
        with gateway(policy) as gw:
            t0 = time.monotonic()
            results = runner.run(AGENT, tasks, gw, model=MODEL, max_concurrent=2, timeout_s=15, prefix="bad")
            took = time.monotonic() - t0
            counters = dict(gw.store.counters)
            closed = set(gw.store.closed)
        with gateway(policy) as gw:  # the same agents in threads (the hung one replaced): the same errors and episodes
            in_threads = run_episodes(AGENT, [{**t, "kind": t["kind"].replace("hangs", "ok"), "log": None}
                                              for t in tasks], gw, model=MODEL, max_concurrent=2, timeout_s=60,
                                      prefix="bad")
    assert [r.error for r in results] == [None, "the agent raised RuntimeError: the agent's tool crashed on 1",
                                          "the agent ran past its timeout", None, None]
    assert [in_threads[i].error for i in (0, 1, 3, 4)] == [results[i].error for i in (0, 1, 3, 4)]
    assert view([results[i] for i in (0, 1, 3, 4)]) == view([in_threads[i] for i in (0, 1, 3, 4)])  # the rest went on
    assert counters["gateway/agent_failures"] == 2 and counters["gateway/agent_timeouts"] == 1
    assert "bad-2" in closed  # the hung agent's episode is closed: a late call would get HTTP 409
    for r in results[1:3]:  # each failed after its three calls: its trajectories kept but marked failed
        assert r.reward == 0.0 and r.trajectories and all(t.meta["failed"] for t in r.trajectories)
    assert took < 120  # the hung task did not hold the step for its 300 s sleep
    events = [line.split() for line in open(log).read().splitlines()]
    hung_pid = int(next(pid for what, pid, _ in events if what == "hang"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(hung_pid):
        time.sleep(0.2)
    assert not _alive(hung_pid)  # ray.cancel(force=True) killed the hung agent's worker process
    assert 1 <= runner.metrics()["cluster/agent_workers"] <= 2  # agent.max_concurrent tasks in flight at most


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _peak(events) -> int:
    """Most agents between their 'start' and 'end' at once."""
    now = peak = 0
    for what, _, _ in sorted(events, key=lambda e: float(e[2])):
        now += {"start": 1, "end": -1}.get(what, 0)
        peak = max(peak, now)
    return peak


def test_a_gateway_on_the_node_address_serves_ray_agents_and_refuses_requests_without_the_key(policy):
    """What a multi-node run does (gateway_host for a joined cluster): the gateway listens on the node's address as
    Ray knows it, the agents reach it there, and a request without the run's key is refused."""
    import httpx
    import ray

    from credo.distributed.ray.agents import RayAgentRunner, gateway_host
    from credo.distributed.ray.config import ClusterConfig

    ip = ray.util.get_node_ip_address()
    assert gateway_host(ClusterConfig(engine="ray", address="auto")) == ip
    assert gateway_host(ClusterConfig(engine="ray", address="")) == "127.0.0.1"
    with one_thread(), gateway(policy, host=ip) as gw:
        assert gw.base_url.startswith(f"http://{ip}:")
        res = RayAgentRunner().run(AGENT, [{"seed": 2}], gw, model=MODEL, timeout_s=120, prefix="node")
        assert res[0].error is None and res[0].reward == 1.0 and res[0].trajectories
        no_key = httpx.post(f"{gw.base_url}/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": "hi"}]}, timeout=30)
        assert no_key.status_code == 401
