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

A role's `resources` is a Ray resource request per worker: CPU, GPU, or a custom label a node was started
with (`ray start --resources '{"decode_gpu": 8}'`). `check_cluster` (credo.config.load, run at every recipe load)
checks values before anything starts; `check_placement` checks the request of every role against Ray's node list
(the live one at start-up, this machine's at `credo check` for a Ray the trainer starts), so a role that no node
can host is a ConfigError naming the role at start-up, never a hang. Nothing here imports Ray.
"""

from __future__ import annotations

import os

from credo.config.load import check_cluster, cluster_class
from credo.config.sections import (DEFAULT_RESOURCES, ElasticConfig, RewardRoleConfig, RoleConfig, RolloutRoleConfig,
                                   role_names)
from credo.errors import ConfigError

__all__ = ["DEFAULT_RESOURCES", "ROLES", "ClusterConfig", "ElasticConfig", "RewardRoleConfig", "RoleConfig",
           "RolloutRoleConfig", "check_cluster", "check_placement", "local_nodes", "resources_of", "role_request"]

ClusterConfig = cluster_class()
"""The `cluster:` section with the built-in families' roles (judge, env: `Family.roles`) after the core's."""
ROLES = role_names(ClusterConfig)
"""Every role of that section, the core's (rollout, reward) then the families', in the order they are checked."""


def resources_of(role_cfg) -> dict:
    """The Ray request of one worker of a role: its `resources`, or {CPU: 1} when empty."""
    return dict(role_cfg.resources) or dict(DEFAULT_RESOURCES)


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
