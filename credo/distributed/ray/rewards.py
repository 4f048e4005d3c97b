"""`RayRewardWorker`: `credo.rewards.worker.RewardWorker`'s interface on an elastic pool of stateless Ray tasks.

RollArc's statefulness-aware principle: a reward function holds no state between calls, so each call is a Ray task
(serverless): the pool is as large as the queue, up to `workers` tasks at once, and shrinks to nothing when idle.
The semantics are `RewardWorker`'s, shared through `credo.rewards.worker.tally`:

- a call that raises is a failure, one that runs past `timeout_s` a timeout (its task is cancelled, which kills
  its worker process); their samples are masked and counted (`reward/failures`, `reward/timeouts`);
- a group call that raises is run again sample by sample (one task per sample);
- a broken contract (wrong length, a non-number) or more than `max_failure_frac` failed samples stop the step.

New here: a call whose worker process dies (killed, out of memory, its node lost) is not the function's failure:
it is run again with the same arguments, and counted in `cluster/reward_restarts`; past `max_restarts` such
losses over the run the pool raises `ClusterWorkerError` naming the role. The timeout clock starts when a call's
task starts running (the task reports it first), so the time a task waits for a free node, a fresh worker process
or the import of the function's module is not counted against it; that wait has its own bound, startup_timeout_s,
past which the pool raises `ClusterWorkerError` naming the role and what the cluster offers (queued work never
waits forever).

Judges are stateful (a model): a judge pool is a `RayRolloutBackend(judge_path, role='judge')` behind `JudgeReward`.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from credo.distributed.ray.config import resources_of, role_request
from credo.distributed.ray.runtime import (ClusterWorkerError, RoleStats, loss_errors, not_started_error,
                                          user_error)
from credo.rewards.worker import GroupRewardFn, RewardResult, note_failure, tally


def _call(fn, *args):
    """The task body, a generator: it reports its start (the timeout clock starts there, not while the task waits
    for a worker process or imports the function's module), then the reward function's value on one group."""
    yield "started"
    yield fn(*args)


class RayRewardWorker:
    """Evaluates groups of responses on Ray tasks (see the module docstring); the interface of `RewardWorker`.

    Args:
        fn: the group reward function (pickled once to the object store; it must be importable or picklable).
        timeout_s: per call, from the moment its task starts running; workers: the most tasks at once;
        max_failure_frac: as RewardWorker.
        resources: the Ray request of each task ({CPU: 1}, or a custom label such as {reward_node: 1}).
        max_restarts: lost worker processes tolerated over the run.
        startup_timeout_s: longest wait for a task to start (placed, its worker up, the function loaded); a call
            not started by then stops the step with a ClusterWorkerError naming the role (no worker can take it).
    """

    def __init__(self, fn: GroupRewardFn, *, timeout_s: float, workers: int, max_failure_frac: float,
                 resources: dict | None = None, max_restarts: int = 3, startup_timeout_s: float = 300.0,
                 role: str = "reward"):
        import ray

        if workers < 1:
            raise ValueError(f"workers is {workers}, expected >= 1 (the most reward tasks at once)")
        self.fn, self.timeout_s, self.cap, self.max_failure_frac = fn, timeout_s, workers, max_failure_frac
        self.role, self.max_restarts, self.restarts = role, max_restarts, 0
        self.startup_timeout_s = startup_timeout_s
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        self._fn_ref = ray.put(fn)
        self.resources = dict(resources or {"CPU": 1})
        self._task = ray.remote(_call).options(**role_request(self.resources), max_retries=0,
                                               num_returns="streaming")
        self._seen_kinds: set[str] = set()
        self.stats = RoleStats(role)
        self._peak = 0
        self._lock = threading.Lock()

    @classmethod
    def from_cluster(cls, cluster, fn: GroupRewardFn, *, timeout_s: float, max_failure_frac: float) -> "RayRewardWorker":
        """Built from the recipe's `cluster:` section (its reward role) and today's reward.timeout_s/max_failure_frac."""
        rc = cluster.reward
        return cls(fn, timeout_s=timeout_s, workers=rc.workers, max_failure_frac=max_failure_frac,
                   resources=resources_of(rc), max_restarts=rc.max_restarts, startup_timeout_s=cluster.startup_timeout_s)

    def _run(self, calls: list[tuple]) -> list[tuple[str, object]]:
        """Each call's outcome, in order: ('ok', value), ('error', exception) or ('timeout', None)."""
        import ray

        outcomes: list = [None] * len(calls)
        pending = deque(range(len(calls)))
        inflight: dict = {}  # task (a generator) -> [call index, dispatched at, started at or None]
        while pending or inflight:
            while pending and len(inflight) < self.cap:
                i = pending.popleft()
                inflight[self._task.remote(self._fn_ref, *calls[i])] = [i, time.monotonic(), None]
            self.stats.queue(len(pending))
            with self._lock:
                self._peak = max(self._peak, len(inflight))
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, min(
                self._deadline(e) for e in inflight.values()) - time.monotonic()))
            for task in ready:
                self._advance(task, inflight, pending, outcomes)
            now = time.monotonic()
            self._check_started(inflight, now)
            for task, entry in list(inflight.items()):
                if now >= self._deadline(entry):
                    del inflight[task]
                    self.stats.busy(now - (entry[2] or now))
                    ray.cancel(task, force=True)  # kills the worker process running it (a thread could not be)
                    outcomes[entry[0]] = ("timeout", None)
        return outcomes

    def _check_started(self, inflight: dict, now: float) -> None:
        """A task still queued past startup_timeout_s means no worker can take it (the other roles hold the cluster,
        or no node offers the request): a ClusterWorkerError naming the role, not a timeout to retry forever."""
        import ray

        if not any(e[2] is None and now >= e[1] + self.startup_timeout_s for e in inflight.values()):
            return
        queued = sum(e[2] is None for e in inflight.values())
        for task in inflight:
            ray.cancel(task, force=True)
        raise not_started_error(self.role, "reward", queued, self.resources, self.startup_timeout_s,
                                "lower cluster.rollout.workers or their resources")

    def _deadline(self, entry: list) -> float:
        i, dispatched, started = entry
        return started + self.timeout_s if started is not None else dispatched + self.startup_timeout_s

    def _advance(self, task, inflight: dict, pending: deque, outcomes: list) -> None:
        """Take the task's next item: its start, or its outcome (a lost worker puts the call back in the queue)."""
        import ray

        entry = inflight[task]
        try:
            value = ray.get(next(task))
        except loss_errors() as e:  # the process died under the call: run it again, counted
            del inflight[task]
            self._lost(e)
            pending.appendleft(entry[0])
            return
        except Exception as e:  # noqa: BLE001 - the function raised: a failure, isolated
            del inflight[task]
            outcomes[entry[0]] = ("error", user_error(e))
            return
        now = time.monotonic()
        if entry[2] is None:  # the "started" item
            entry[2] = now
            return
        del inflight[task]
        self.stats.busy(now - entry[2])
        outcomes[entry[0]] = ("ok", value)

    def _lost(self, cause: BaseException) -> None:
        self.restarts += 1
        self.stats.restarted()
        if self.restarts > self.max_restarts:
            raise ClusterWorkerError(f"role '{self.role}': reward workers were lost {self.restarts} times, more than "
                                     f"cluster.{self.role}.max_restarts = {self.max_restarts}; last cause: {cause}")

    def __call__(self, groups: list[tuple], *, step: int) -> RewardResult:
        """Score `groups` ((responses, problems) pairs, or with completion ids); results flattened in order."""
        return tally(groups, self._run, step=step, name=self.name, timeout_s=self.timeout_s,
                     max_failure_frac=self.max_failure_frac, names=getattr(self.fn, "names", ()),
                     seen_kinds=self._seen_kinds)

    def run_one(self, *args) -> tuple[str, object]:
        """Run `fn(*args)` once under the timeout, without the reward-list checks; ('ok'|'error'|'timeout', value)."""
        status, value = self._run([args])[0]
        note_failure(status, value, name=self.name, timeout_s=self.timeout_s, seen_kinds=self._seen_kinds)
        return status, value

    def metrics(self) -> dict:
        """`cluster/reward_*` since the last call; `workers` is the most tasks that ran at once."""
        with self._lock:
            peak, self._peak = self._peak, 0
        return self.stats.read(peak)

    def close(self) -> None:
        """Nothing to stop: tasks end with their calls (safe to call twice)."""
