"""`RayAgentRunner`: the agent contract (credo.gateway.agents) with each episode's agent a Ray task
(agent.placement: ray, role `cluster.agent`).

    runner = RayAgentRunner(resources={"CPU": 0.25})
    results = runner.run(agent, tasks, gateway, model="policy", max_concurrent=8, timeout_s=600, prefix="step3")

Each episode is one task, `agent(base_url=, api_key=, model=, task=)` on a Ray worker, calling the gateway over HTTP
with the episode's own key; at most `max_concurrent` tasks are in flight (dispatched in task order), and the results
come back in task order, as `run_episodes`' do (`episode_result` is shared, so rewards, errors, counters and the
episode's trajectories are built the same way). What changes:

- a task whose agent runs past `timeout_s` is really stopped: its episode is closed in the gateway's store first (a
  call still in flight then gets HTTP 409), then the task is cancelled with `force=True`, which kills the worker
  process. Counted as a thread's timeout (`gateway/agent_timeouts`, `agent/timeouts`);
- the clock starts when the task starts running (it reports it first, after loading the agent), not while it waits
  for a CPU or a worker process; tasks that wait with no other task of the call starting or ending for
  `startup_timeout_s` stop the step with a `ClusterWorkerError` naming the role (nothing could run them);
- an agent that raises on the worker fails its own episode with the error a thread gives (`the agent raised
  RuntimeError: ...`: Ray's wrapper is taken off); an entry point the worker cannot import fails the same way;
- a task whose worker process is lost (killed, out of memory, node gone) fails its own episode (`the agent's Ray
  worker was lost: ...`, counted in `gateway/agent_failures` and `cluster/agent_restarts`). It is not run again: its
  calls so far are recorded, so a rerun would not be the same episode.
"""

from __future__ import annotations

import time

from credo.distributed.ray.config import role_request
from credo.distributed.ray.runtime import (ClusterWorkerError, RoleStats, loss_errors, not_started_error,
                                          user_error)


def gateway_host(cluster) -> str:
    """Where the gateway listens when agents run on Ray workers (`cluster` is the recipe's `cluster:` section).

    127.0.0.1 when the run started its own Ray (`cluster.address: ''`): credo starts it loopback-only (`local_only`),
    so every worker is on this machine. Otherwise (a cluster joined by 'auto', 'host:port' or 'ray://...', or a local
    head opened to other nodes with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1) this node's address as Ray knows it
    (`ray.util.get_node_ip_address()`), which the other nodes reach. Never 0.0.0.0, and never without the run's key:
    the gateway refuses every request that does not carry it (HTTP 401)."""
    import os

    opened = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0").lower() in ("1", "true")
    if not cluster.address and not opened:
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def _episode(agent, kwargs: dict):
    """The task body, a generator: load the agent, report the start (the timeout clock starts there), run it."""
    from credo.gateway.agents import load_agent

    fn = load_agent(agent) if isinstance(agent, str) else agent
    yield "started"
    yield fn(**kwargs)


class RayAgentRunner:
    """Runs episodes as Ray tasks asking for `resources` each (see the module docstring); `metrics()` gives
    `cluster/agent_*` (tasks at once at most, busy fraction, queue depth, lost workers) since the last call."""

    def __init__(self, *, resources: dict | None = None, startup_timeout_s: float = 300.0, role: str = "agent"):
        import ray

        self.resources, self.role = dict(resources or {"CPU": 0.25}), role
        self.startup_timeout_s = startup_timeout_s
        self._task = ray.remote(_episode).options(**role_request(self.resources), max_retries=0,
                                                  num_returns="streaming")
        self.stats = RoleStats(role)
        self._peak = 0

    @classmethod
    def from_cluster(cls, cluster) -> "RayAgentRunner":
        """Built from the recipe's `cluster:` section (its agent role)."""
        from credo.distributed.ray.config import resources_of

        return cls(resources=resources_of(cluster.agent), startup_timeout_s=cluster.startup_timeout_s)

    def run(self, agent, tasks: list[dict], gateway, *, model: str, max_concurrent: int = 8, timeout_s: float = 600.0,
            prefix: str | None = None, base_url: str | None = None) -> list:
        """`run_episodes`' call on Ray tasks: an `EpisodeResult` per task, in task order. `base_url`: where the
        workers reach the gateway (default `gateway.base_url`)."""
        import ray

        from credo.gateway.agents import episode_prefix, episode_result

        prefix = episode_prefix(tasks, gateway, max_concurrent, prefix)
        url = base_url or gateway.base_url
        outcome: list[dict] = [{} for _ in tasks]
        inflight: dict = {}  # task (a generator) -> [index, started at or None]
        todo = list(range(len(tasks)))[::-1]
        progress = time.monotonic()  # the last time a task of this call was dispatched, started or ended
        try:
            while todo or inflight:
                while todo and len(inflight) < max_concurrent:
                    i = todo.pop()
                    kwargs = dict(base_url=url, api_key=gateway.episode_key(f"{prefix}-{i}"), model=model,
                                  task=dict(tasks[i]))
                    inflight[self._task.remote(agent, kwargs)] = [i, None]
                    progress = time.monotonic()
                self._peak = max(self._peak, len(inflight))
                self.stats.queue(sum(e[1] is None for e in inflight.values()))
                now = time.monotonic()
                deadlines = [e[1] + timeout_s if e[1] is not None else progress + self.startup_timeout_s
                             for e in inflight.values()]
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, min(min(deadlines) - now, 1.0)))
                for task in ready:
                    if self._advance(task, inflight, outcome, gateway, prefix):
                        progress = time.monotonic()
                now = time.monotonic()
                for task, (i, started) in list(inflight.items()):
                    if started is not None and now >= started + timeout_s:
                        del inflight[task]
                        outcome[i].update(timed_out=True, seconds=now - started)
                        gateway.store.close(f"{prefix}-{i}")  # its late calls: HTTP 409
                        ray.cancel(task, force=True)  # kills the worker process (a thread could not be)
                        self.stats.busy(now - started)
                        progress = now
                if inflight and all(e[1] is None for e in inflight.values()) and now >= progress + self.startup_timeout_s:
                    raise self._not_started(len(inflight))
        except BaseException:
            for task, (i, _) in inflight.items():  # the step stops: no agent of it runs on, nor writes to the store
                gateway.store.close(f"{prefix}-{i}")
                ray.cancel(task, force=True)
            raise
        return [episode_result(f"{prefix}-{i}", task, outcome[i], gateway) for i, task in enumerate(tasks)]

    def _advance(self, task, inflight: dict, outcome: list, gateway, prefix: str) -> bool:
        """Take the task's next item: its start, its value, or its error (the episode's own). True on any of them."""
        import ray

        entry = inflight[task]
        i, started = entry
        now = time.monotonic()
        try:
            value = ray.get(next(task))
        except StopIteration:  # pragma: no cover - the body always yields twice before it ends
            return False
        except loss_errors() as e:
            del inflight[task]
            self.stats.restarted()
            gateway.store.close(f"{prefix}-{i}")
            outcome[i].update(error=f"the agent's Ray worker was lost: {type(e).__name__}: {str(e).splitlines()[0]}",
                              seconds=now - (started or now))
            return True
        except Exception as e:  # noqa: BLE001 - the agent raised: its episode's failure, as in a thread
            del inflight[task]
            err = user_error(e)
            outcome[i].update(error=f"the agent raised {type(err).__name__}: {err}", seconds=now - (started or now))
            self.stats.busy(now - (started or now))
            return True
        if started is None:  # the "started" item
            entry[1] = now
            return True
        del inflight[task]
        outcome[i].update(value=value, seconds=now - started)
        self.stats.busy(now - started)
        return True

    def _not_started(self, queued: int) -> ClusterWorkerError:
        return not_started_error(self.role, "agent", queued, self.resources, self.startup_timeout_s,
                                 "lower cluster.agent.resources or the other roles'")

    def metrics(self) -> dict:
        """`cluster/agent_*` since the last call; `workers` is the most tasks in flight at once."""
        peak, self._peak = self._peak, 0
        return self.stats.read(peak)

    def close(self) -> None:
        """Nothing to stop: tasks end with their episodes (safe to call twice)."""
