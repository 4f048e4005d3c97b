"""The recipe's `cluster:` section (its schema: credo/config/sections.py) on the Ray side: where each role runs
(RollArc's hardware-affinity mapping) and whether the cluster can host it.

    cluster:
      engine: ray                  # local (default): everything in the trainer processes
      address: auto                # join a running cluster; "" starts a local Ray
      sync: delta                  # full | delta weight pushes through the object store
      rollout: {workers: 2, resources: {decode_gpu: 1}, elastic: {min: 1, max: 4}}
      reward:  {workers: 8, resources: {CPU: 1}}     # the cap of the elastic task pool
      judge:   {workers: 1, resources: {GPU: 1}}
      env:     {workers: 2, resources: {CPU: 2}}
      teacher: {workers: 1, resources: {GPU: 1}}     # distill.placement: ray
      agent:   {resources: {CPU: 0.25}}               # agent.placement: ray (one task per episode)

A role's `resources` is a Ray resource request per worker: CPU, GPU, or a custom label a node was started
with (`ray start --resources '{"decode_gpu": 8}'`). `check_cluster` (credo.config.load, run at every recipe load)
checks values before anything starts; `check_placement` checks the request of every role against Ray's node list
(the live one at start-up, this machine's at `credo check` for a Ray the trainer starts), so a role that no node
can host is a ConfigError naming the role at start-up, never a hang. `check_capacity` adds the sum over roles: the
actors of every role the run uses (rollout, judge, env, teacher) hold their request for the whole run, so they and
at least one reward task must fit the cluster together, or the reward pool never runs a task (a hang before it had a
timeout).
`check_at_preflight` is what `credo check` runs: the capacity against this machine for a Ray the trainer starts, and
for `cluster.address` a probe that a Ray is listening there. Nothing here imports Ray at module level.
"""

from __future__ import annotations

import os

from credo.config.load import check_cluster, cluster_class
from credo.config.sections import (DEFAULT_RESOURCES, ElasticConfig, RewardRoleConfig, RoleConfig, RolloutRoleConfig,
                                   role_names)
from credo.errors import ConfigError

__all__ = ["DEFAULT_RESOURCES", "ROLES", "ClusterConfig", "ElasticConfig", "RewardRoleConfig", "RoleConfig",
           "RolloutRoleConfig", "check_at_preflight", "check_capacity", "check_cluster", "check_placement", "local_nodes",
           "resources_of", "role_request", "run_roles"]

ClusterConfig = cluster_class()
"""The `cluster:` section with the built-in families' roles (judge, env: `Family.roles`) after the core's."""
ROLES = role_names(ClusterConfig)
"""Every role of that section, the core's (rollout, reward) then the families', in the order they are checked."""


def resources_of(role_cfg) -> dict:
    """The Ray request of one worker of a role: its `resources`, or when empty the role's `default_resources` (the
    agent role's {CPU: 0.25}), else {CPU: 1}."""
    return dict(role_cfg.resources) or dict(getattr(role_cfg, "default_resources", DEFAULT_RESOURCES))


def role_request(resources: dict) -> dict:
    """Ray actor/task options for a resource request: {CPU: 1, GPU: 1, x: 2} -> num_cpus, num_gpus, resources."""
    opts = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        opts["resources"] = custom
    return opts


def check_placement(cfg, nodes: list[dict], roles: tuple[str, ...] | None = None) -> None:
    """Raise a ConfigError naming the first role whose per-worker request no alive node can satisfy.

    Args:
        nodes: Ray's node list (`ray.nodes()`): dicts with 'Alive' and 'Resources' ({name: total}).
        roles: the roles this run uses (a single-turn run has no env role); None: every role of `cfg`.
    """
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if not alive:
        raise ConfigError("cluster: Ray reports no alive node; check cluster.address")
    for role in role_names(cfg) if roles is None else roles:
        rc = getattr(cfg, role)
        if not rc.workers:
            continue
        request = resources_of(rc)
        if not any(all(node.get(k, 0) >= v for k, v in request.items()) for node in alive):
            offered = sorted({k for node in alive for k in node if not k.startswith("node:")})
            raise ConfigError(f"config key 'cluster.{role}.resources' = {request}: no node of the Ray cluster "
                              f"offers that (resources on the nodes: {', '.join(offered)}); role '{role}' cannot be placed")


def local_nodes(cfg: ClusterConfig) -> list[dict]:
    """The node list (shaped like `ray.nodes()`) of the local Ray that `cluster.address: ''` starts on this machine:
    one node with num_cpus CPUs (all when 0), this machine's CUDA GPUs, and no custom label."""
    resources = {"CPU": float(cfg.num_cpus or os.cpu_count() or 1)}
    try:
        import torch

        if torch.cuda.is_available():
            resources["GPU"] = float(torch.cuda.device_count())
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    return [{"Alive": True, "Resources": resources}]


ACTOR_ROLES = ("rollout", "judge", "env", "teacher")
"""Roles whose workers are actors: each holds its request for the whole run."""


TASK_ROLES = ("reward", "agent")
"""Roles whose workers are tasks that end with their call: the capacity check counts one of each at least."""


def run_roles(r) -> tuple[str, ...]:
    """The roles recipe `r` puts on Ray workers: rollout always; the reward pool with the default reward stage (not
    when an active family makes its own stage the default: the agent family's); the judge and env roles when their
    family is active and has workers (as the families' own builders decide); the distillation teacher's with
    distill.placement: ray; the agents' tasks with agent.placement: ray."""
    from credo.family import active_families

    c = r.cluster
    families = active_families(r)
    active = {f.name for f in families}
    own_reward = any("reward" in f.stage_defaults(r) for f in families)
    roles = ["rollout"]
    if r.stages.reward == "default" and not own_reward and c.reward.workers:
        roles.append("reward")
    if "judges" in active and c.judge.workers:
        roles.append("judge")
    if "multiturn" in active and c.env.workers:
        roles.append("env")
    if "distill" in active and r.distill.placement == "ray" and c.teacher.workers:
        roles.append("teacher")
    if "agent" in active and r.agent.placement == "ray":
        roles.append("agent")
    return tuple(roles)


def _fmt(res: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(res.items())) + "}"


def cluster_totals(nodes: list[dict]) -> dict:
    """Each resource summed over the alive nodes (Ray's per-node `node:<ip>` markers left out)."""
    out: dict = {}
    for n in nodes:
        if n.get("Alive", True):
            for k, v in n.get("Resources", {}).items():
                if not k.startswith("node:") and k != "object_store_memory" and k != "memory":
                    out[k] = out.get(k, 0.0) + float(v)
    return out


def check_capacity(cfg: ClusterConfig, nodes: list[dict], roles: tuple[str, ...], *, key: str = "") -> list[str]:
    """The sum over `roles` against the cluster's totals: every actor role's workers x request plus one task of the
    reward pool (it runs as many tasks at once as are free, up to cluster.reward.workers) must fit, else a
    ConfigError naming the roles, their sum and what the cluster offers; its key is the first role's that does not
    fit even alone (cluster.teacher.workers for a GPU teacher on a CPU cluster), else cluster.rollout.workers.
    Returns a note when the reward pool's cap cannot all run at once beside the actors (it then runs fewer tasks at
    once: slower, not stuck).

    Args:
        key: the setting that sizes the cluster, named in the error (cluster.num_cpus for a local Ray).
    """
    totals = cluster_totals(nodes)
    need: dict = {}
    parts = []
    alone = []  # roles whose own workers do not fit the cluster even without the others
    for role in roles:
        rc = getattr(cfg, role)
        if not rc.workers:
            continue
        req = resources_of(rc)
        n = rc.workers if role in ACTOR_ROLES else 1
        for k, v in req.items():
            need[k] = need.get(k, 0.0) + n * v
        if any(n * v > totals.get(k, 0.0) + 1e-9 for k, v in req.items()):
            alone.append(role)
        parts.append(f"{role} {n} x {_fmt(req)}" + (" (one task at least)" if role in TASK_ROLES else ""))
    short = {k: v for k, v in need.items() if v > totals.get(k, 0.0) + 1e-9}
    if short:
        offered = {k: totals.get(k, 0.0) for k in need}
        hint = f"; raise {key}" if key else ""
        named = alone[0] if alone else "rollout"  # the role that cannot fit by itself, else the rollout actors
        if named in TASK_ROLES:  # one task of it does not fit: its request is at fault, not a number of workers
            key_value = f"config key 'cluster.{named}.resources' = {_fmt(resources_of(getattr(cfg, named)))}"
            fix = f"ask for less, or for what the nodes offer (cluster.{named}.resources)"
        else:
            key_value = f"config key 'cluster.{named}.workers' = {getattr(cfg, named).workers}"
            fix = f"lower cluster.{named}.workers, ask for a fraction (cluster.{named}.resources: {{CPU: 0.5}})"
        raise ConfigError(
            f"{key_value}: the run's roles ask for {_fmt(need)} in all ({'; '.join(parts)}) but the Ray cluster offers "
            f"{_fmt(offered)}: the actors would hold it all and the rest could never be placed (the run would hang); "
            f"{fix}{hint}")
    if "reward" in roles and cfg.reward.workers > 1:
        req = resources_of(cfg.reward)
        room = min((totals.get(k, 0.0) - need[k] + v) / v for k, v in req.items())
        if room < cfg.reward.workers:
            return [f"cluster.reward.workers = {cfg.reward.workers}: beside the actors the cluster has room for "
                    f"{int(room)} reward task(s) of {_fmt(req)} at once; the pool runs that many"]
    return []


_PROBE_AS_NOTE = False


class address_probe_as_note:
    """`credo check` may run off the cluster (a laptop, a login node): there, no Ray at cluster.address is a warning
    line, not an error; `credo run` (and `credo.train`) stop on it before the warm-up."""

    def __enter__(self):
        global _PROBE_AS_NOTE
        self.old, _PROBE_AS_NOTE = _PROBE_AS_NOTE, True

    def __exit__(self, *exc):
        global _PROBE_AS_NOTE
        _PROBE_AS_NOTE = self.old


def check_at_preflight(r) -> list[str]:
    """`credo check`'s cluster checks beyond each role's placement (cluster.engine: ray): with cluster.address, that
    a Ray is listening there (a ConfigError naming the key otherwise, before any warm-up), the capacity left to
    start-up; without, the sum over roles against this machine (`check_capacity`)."""
    c = r.cluster
    if c.engine != "ray":
        return []
    roles = run_roles(r)
    if c.address:
        from credo.distributed.ray.runtime import probe_address

        notes = []
        try:
            probe_address(c.address)
        except ConfigError as e:
            if not _PROBE_AS_NOTE:
                raise
            notes.append(f"warning: {e}; `credo run` stops there, before its warm-up, unless that cluster is up by then")
        return notes + [f"cluster capacity of {', '.join(roles)} not checked here (cluster.address = '{c.address}'): checked "
                "against the live cluster at start-up"]
    return check_capacity(c, local_nodes(c), roles, key="cluster.num_cpus")
