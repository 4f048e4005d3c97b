"""The run's cluster (`cluster:` section): the in-process engine, or Ray workers for rollout, rewards and envs.

    cluster = open_cluster(r)              None for engine: local (nothing changes: no Ray is imported)
    cluster.rollout_backend(r, engine, path)   a RayRolloutBackend in place of the hf/vllm backend
    cluster.reward_worker(r, fn)           a RayRewardWorker in place of the threaded RewardWorker
    cluster.track(part)                    any other Ray part (a family's env pool): metrics logged, closed at the end
    cluster.hook                           a step hook that logs cluster/* after each weight sync
    cluster.close()                        stops every worker (and the local Ray it started)

`open_cluster` starts or joins Ray (`cluster.address`) and checks that the rollout and reward roles can be placed,
and that every role the run uses fits the cluster together (`check_capacity`), before any worker starts (a ConfigError naming the role, never a hang); a family checks its own role the same way
when it builds its pool (`check_role`). Ray is imported only here and under credo/distributed/ray/.
"""

from __future__ import annotations

import time

from credo.config import Recipe


class Cluster:
    """The Ray parts of one run, their metrics and their shutdown (see the module docstring)."""

    def __init__(self, cfg, *, connect_s: float, started_ray: bool):
        self.cfg, self.connect_s, self.started_ray = cfg, connect_s, started_ray
        self.parts: list = []
        self.hook = ClusterHook(self)

    def track(self, part):
        """Log `part.metrics()` each step and close it with the run; returns `part`."""
        self.parts.append(part)
        return part

    def check_role(self, role: str) -> None:
        """ConfigError naming `role` when no alive node offers its per-worker request."""
        import ray

        from credo.distributed.ray.config import check_placement

        check_placement(self.cfg, ray.nodes(), (role,))

    def rollout_backend(self, r: Recipe, engine, policy_path: str, prompt_embeds: bool = False):
        """The policy's rollout workers, seeded with the trainer's weights (version 0) before the first step;
        `prompt_embeds`: the plan needs them (a source with soft prefixes)."""
        from credo.distributed.ray.rollout import RayRolloutBackend

        ro = r.rollout
        vllm = None
        if ro.backend == "vllm":
            from credo.distributed.ray.config import resources_of

            eager = ro.vllm_enforce_eager  # unset: eager on CPU workers, graphs on GPU ones (as the local builder)
            vllm = dict(kv_cache_gib=ro.vllm_kv_cache_gib, gpu_memory_utilization=ro.vllm_gpu_memory_utilization,
                        enforce_eager=("GPU" not in resources_of(self.cfg.rollout)) if eager is None else eager,
                        seed=r.run.seed)
        t0 = time.perf_counter()
        backend = RayRolloutBackend.from_cluster(self.cfg, policy_path, engine=ro.backend, model_dtype=r.model.dtype,
                                                 dtype=ro.dtype, fp8_weights=ro.fp8_weights, max_batch=ro.hf_max_batch,
                                                 initial_model=engine.module, vllm_kwargs=vllm,
                                                 prompt_embeds=prompt_embeds)
        self.rollout_start_s = time.perf_counter() - t0
        return self.track(backend)

    def reward_worker(self, r: Recipe, fn):
        """The reward function as an elastic pool of stateless Ray tasks, or None when cluster.reward.workers is 0."""
        if not self.cfg.reward.workers:
            return None
        from credo.distributed.ray.rewards import RayRewardWorker

        return self.track(RayRewardWorker.from_cluster(self.cfg, fn, timeout_s=r.reward.timeout_s,
                                                       max_failure_frac=r.reward.max_failure_frac))

    def metrics(self) -> dict:
        from credo.distributed.ray.runtime import cluster_metrics

        return cluster_metrics(*(p.metrics() for p in self.parts))

    def close(self) -> None:
        parts, self.parts = self.parts, []
        for part in parts:
            part.close()
        if self.started_ray:
            import ray

            ray.shutdown()
            self.started_ray = False


class ClusterHook:
    """A step hook: after the weight sync, the window's cluster/* metrics (workers, busy fraction, queue depth,
    restarts, weight-sync seconds and bytes); the first step also logs the start-up seconds."""

    name = "cluster"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.first = True

    def before_step(self, step: int) -> None:
        pass

    def after_sync(self, step: int, batch) -> dict:
        out = self.cluster.metrics()
        if self.first:
            out["cluster/connect_s"] = self.cluster.connect_s
            out["cluster/rollout_start_s"] = getattr(self.cluster, "rollout_start_s", 0.0)
            self.first = False
        return out


def open_cluster(r: Recipe) -> Cluster | None:
    """None for cluster.engine: local; else Ray started or joined, the rollout and reward roles checked placeable."""
    c = r.cluster
    if c.engine == "local":
        return None
    import ray

    from credo.distributed.ray.runtime import connect

    started = not ray.is_initialized() and not c.address
    roles = ("rollout", "reward") if r.stages.reward == "default" else ("rollout",)
    connect_s = connect(c, roles=roles, verbose=r.run.verbose)
    check_live_capacity(r)
    return Cluster(c, connect_s=connect_s, started_ray=started)


def check_live_capacity(r: Recipe) -> None:
    """The sum over the run's roles against the live cluster's nodes (`check_capacity`), before any worker starts:
    a remote cluster is checked only here (`credo check` cannot see it); its note is logged. A Ray the run starts
    itself was checked, and its note logged, at the preflight against the same CPUs: logged again here, every local
    Ray run printed it twice (issue 57's round-4 trial)."""
    import logging

    import ray

    from credo.distributed.ray.config import check_capacity, run_roles

    key = "" if r.cluster.address else "cluster.num_cpus"
    for note in check_capacity(r.cluster, ray.nodes(), run_roles(r), key=key):
        if r.cluster.address:
            logging.getLogger("credo.cluster").info("%s", note)
