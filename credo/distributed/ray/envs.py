"""Env workers: GEM-protocol environments held by Ray actors, behind proxies with the same reset/step methods.

    pool = RayEnvPool(functools.partial(make_env, "credo:GuessNumber-v0"), workers=2, timeout_s=10)
    MultiTurnRollout(..., env_factory=pool.make_env)      # the multi-turn source, unchanged
    env = pool.make_env(); env.reset(seed=3); env.step("4")

`make_env()` returns a `RayEnv` proxy at once; its environment is built in an env actor (round robin) at its
first `reset`. The source steps many proxies from its own threads, so each env actor runs up to
`max_concurrency` calls at once (threads, as the source's local daemon threads): an env step that hangs holds
one actor thread and only its own episode, which the source's deadline (env.step_timeout_s) ends as failed,
exactly as in a local run. A call that raises re-raises the env's own exception in the proxy (counted in
env/failures by the source).

Worker loss: when an env actor dies, the first proxy to notice replaces it (counted in `cluster/env_restarts`;
past max_restarts over the run the pool raises `ClusterWorkerError` naming the role) and every proxy whose env
lived there rebuilds it on the new actor by replaying its episode (reset with its seed, then its actions so far)
before its next call. For an env that is a function of its seed and actions (GEM's games are), the episode goes
on as if nothing happened. `expert_action` (the scripted expert of IPA's resampling) is forwarded when the env
has one; it must not change the env's state.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
import weakref
from collections import deque

from credo.distributed.ray.config import resources_of
from credo.distributed.ray.runtime import RoleStats, WorkerGroup, loss_errors, user_error


class EnvWorker:
    """An env actor: environments by id, built with `make_env()` (made a Ray actor by `WorkerGroup`)."""

    def __init__(self, make_env):
        self.make_env = make_env
        self.envs: dict[int, object] = {}
        self.probe = make_env()  # fail at start-up, not at the first episode, when the env cannot be built

    def ready(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def has(self, attribute: str) -> bool:
        return hasattr(self.probe, attribute)

    def reset(self, env_id: int, seed, kwargs: dict):
        self.envs[env_id] = env = self.make_env()
        return env.reset(seed=seed, **kwargs)

    def step(self, env_id: int, action):
        return self.envs[env_id].step(action)

    def expert_action(self, env_id: int, rng_state, noise: float):
        """The env's expert action with a `random.Random` whose state travels both ways."""
        rng = random.Random()
        rng.setstate(rng_state)
        action = self.envs[env_id].expert_action(rng, noise)
        return action, rng.getstate()

    def replay(self, env_id: int, seed, kwargs: dict, actions: list) -> None:
        """Rebuild env `env_id` here: reset with its seed, then its actions so far (after a worker was replaced)."""
        self.reset(env_id, seed, kwargs)
        for a in actions:
            self.envs[env_id].step(a)

    def drop(self, env_ids: list[int]) -> None:
        for i in env_ids:
            self.envs.pop(i, None)

    def close(self) -> None:
        self.envs.clear()


class RayEnv:
    """A proxy with a GEM env's methods; its env lives in an env actor of `pool` (see the module docstring)."""

    def __init__(self, pool: "RayEnvPool", env_id: int, slot: int):
        self._pool, self._id, self._slot = pool, env_id, slot
        self._handle = None  # the actor that holds this env; another one in the slot means the env must be replayed
        self._reset_args: tuple | None = None
        self._actions: list = []

    def reset(self, seed=None, **kwargs):
        self._reset_args, self._actions = (seed, kwargs), []
        out = self._pool.call(self, "reset", seed, kwargs)
        return out

    def step(self, action):
        out = self._pool.call(self, "step", action)
        self._actions.append(action)
        return out

    def __getattr__(self, name: str):
        if name == "expert_action" and self._pool.has_expert:
            return self._expert_action
        raise AttributeError(f"{type(self).__name__} (a Ray env proxy) has no attribute '{name}'")

    def _expert_action(self, rng: random.Random, noise: float = 0.0):
        action, state = self._pool.call(self, "expert_action", rng.getstate(), noise)
        rng.setstate(state)
        return action


class RayEnvPool:
    """`workers` env actors and the proxies of their envs.

    Args:
        make_env: a picklable zero-argument callable returning a fresh env (e.g. functools.partial(make_env, id)).
        workers: env actors; resources: the Ray request of each; max_concurrency: calls one actor runs at once.
        timeout_s: the longest a proxy waits for one call (the source's own deadline, env.step_timeout_s, ends the
            episode first; this bounds the proxy's thread).
        max_restarts: env actors replaced over the run before the pool raises.
    """

    def __init__(self, make_env, *, workers: int = 1, resources: dict | None = None, max_concurrency: int = 64,
                 timeout_s: float = 60.0, max_restarts: int = 3, startup_timeout_s: float = 120.0, role: str = "env"):
        import ray

        self.group = WorkerGroup(role, EnvWorker, args=(make_env,), resources=resources or {"CPU": 1},
                                 max_restarts=max_restarts, startup_timeout_s=startup_timeout_s,
                                 max_concurrency=max_concurrency)
        self.role, self.timeout_s = role, timeout_s
        self.slots = self.group.start(workers)
        self.has_expert = ray.get(self.group.handles[self.slots[0]].has.remote("expert_action"), timeout=timeout_s)
        self._ids = itertools.count()
        self._dropped: deque = deque()  # (slot, env id) of proxies gone; flushed by make_env
        self._lock = threading.Lock()
        self._active = {s: 0 for s in self.slots}
        self._busy_since: dict[int, float] = {}

    @classmethod
    def from_cluster(cls, cluster, make_env, *, timeout_s: float) -> "RayEnvPool":
        """Built from the recipe's `cluster:` section (its env role); timeout_s: env.step_timeout_s."""
        rc = cluster.env
        return cls(make_env, workers=rc.workers, resources=resources_of(rc), max_concurrency=rc.max_concurrency,
                   timeout_s=timeout_s, max_restarts=rc.max_restarts, startup_timeout_s=cluster.startup_timeout_s)

    def make_env(self) -> RayEnv:
        """A new env proxy (the multi-turn source's `env_factory`); raises once the role ran out of restarts."""
        self.group.check()
        self._flush_drops()
        env_id = next(self._ids)
        env = RayEnv(self, env_id, self.slots[env_id % len(self.slots)])
        weakref.finalize(env, self._dropped.append, (env._slot, env_id))
        return env

    def _flush_drops(self) -> None:
        by_slot: dict[int, list[int]] = {}
        while self._dropped:
            slot, env_id = self._dropped.popleft()
            by_slot.setdefault(slot, []).append(env_id)
        for slot, ids in by_slot.items():
            self.group.handles[slot].drop.remote(ids)  # fire and forget: a lost actor lost them anyway

    def call(self, env: RayEnv, method: str, *args):
        """Run `method` on `env`'s env in its actor; replace a lost actor and replay the env there, then retry."""
        import ray
        from ray.exceptions import GetTimeoutError

        while True:
            self.group.check()
            handle = self.group.handles[env._slot]
            try:
                if env._handle is not handle and method != "reset" and env._reset_args is not None:
                    self._timed(env._slot, handle.replay.remote(env._id, *env._reset_args, env._actions))
                env._handle = handle
                return self._timed(env._slot, getattr(handle, method).remote(env._id, *args))
            except loss_errors() as e:
                self.group.replace(env._slot, handle, e)  # counted once, by the first proxy to see it
            except GetTimeoutError:
                raise TimeoutError(f"role '{self.role}': env call '{method}' ran past {self.timeout_s} s (queued or "
                                   "running: env.step_timeout_s)") from None
            except ray.exceptions.RayTaskError as e:
                raise user_error(e) from None

    def _timed(self, slot: int, ref):
        """ray.get(ref) with the pool's timeout, counting the slot's busy time (any call running in it)."""
        import ray

        with self._lock:
            self._active[slot] = self._active.get(slot, 0) + 1
            if self._active[slot] == 1:
                self._busy_since[slot] = time.monotonic()
            self.group.stats.queue(sum(self._active.values()))
        try:
            return ray.get(ref, timeout=self.timeout_s)
        finally:
            with self._lock:
                self._active[slot] -= 1
                if self._active[slot] == 0:
                    self.group.stats.busy(time.monotonic() - self._busy_since.pop(slot))

    def worker_info(self) -> dict[int, dict]:
        return {s: self.group.info[s] for s in self.slots}

    def metrics(self) -> dict:
        """`cluster/env_*` since the last call: workers, busy_frac (share of time an actor had a call),
        queue_depth (most calls outstanding at once), restarts."""
        return self.group.stats.read(len(self.slots))

    def close(self) -> None:
        self.group.close()
