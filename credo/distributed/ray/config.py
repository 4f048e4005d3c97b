"""The recipe's `cluster:` section: where each role runs (RollArc's hardware-affinity mapping) and how.

    cluster:
      engine: ray                  # local (default): everything in the trainer processes
      address: auto                # join a running cluster; "" starts a local Ray
      sync: delta                  # full | delta weight pushes through the object store
      rollout: {workers: 2, resources: {decode_gpu: 1}, elastic: {min: 1, max: 4}}
      reward:  {workers: 8, resources: {CPU: 1}}     # the cap of the elastic task pool
      judge:   {workers: 1, resources: {GPU: 1}}
      env:     {workers: 2, resources: {CPU: 2}}

A role's `resources` is a Ray resource request per worker: CPU, GPU, or a custom label a node was started
with (`ray start --resources '{"decode_gpu": 8}'`). `check_cluster` checks values before anything starts;
`check_placement` checks the request of every role against Ray's live node list, so a role that no node can
host is a ConfigError naming the role at start-up, never a hang. Nothing here imports Ray.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from credo.config import ConfigError, checked, one_of, ranged

ROLES = ("rollout", "reward", "judge", "env")
"""The roles a cluster places, in the order they are checked and reported."""


DEFAULT_RESOURCES = {"CPU": 1}
"""A role's request when its `resources` is left empty."""


def _is_resource_request(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in value.items())


def resources_of(role_cfg) -> dict:
    """The Ray request of one worker of a role: its `resources`, or {CPU: 1} when empty."""
    return dict(role_cfg.resources) or dict(DEFAULT_RESOURCES)


@dataclass
class ElasticConfig:
    min: int = ranged(0, ge=0)
    """Fewest rollout workers the pool may shrink to while workers leave (>= 1 when elastic)."""
    max: int = ranged(0, ge=0)
    """Most rollout workers at once, dedicated and opportunistic; 0 = a fixed pool of rollout.workers."""


@dataclass
class RoleConfig:
    workers: int = ranged(1, ge=0)
    """Workers (Ray actors) of this role; 0 = the role stays in the trainer process."""
    resources: dict = checked(None, _is_resource_request, "a mapping of resource name to an amount > 0, e.g. {GPU: 1}",
                              factory=dict)
    """Ray resources each worker asks for: {CPU: 1}, {GPU: 1}, or custom node labels such as {decode_gpu: 1};
    empty = {CPU: 1}. (Empty by default so a recipe's mapping replaces it rather than merging into it.)"""
    max_restarts: int = ranged(3, ge=0)
    """Restarts of this role's workers (killed, crashed or hung) over the run before it stops with an error."""


@dataclass
class RolloutRoleConfig(RoleConfig):
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Workers may join and leave a running job (ROSE's opportunistic capacity): {min, max}; max 0 = a fixed pool."""
    per_sample_seeds: bool = True
    """Each prompt's tokens depend on its own seed only, so any worker count draws the same tokens. False = one RNG
    stream per call like the local hf backend: bit-identical to a local run, but only with one worker."""
    threads: int = ranged(1, ge=1)
    """torch intra-op threads of each rollout worker (match run.threads for bitwise parity with a local run)."""


@dataclass
class RewardRoleConfig(RoleConfig):
    workers: int = ranged(4, ge=0)
    """Cap of the elastic reward pool: stateless Ray tasks running at once (the pool grows with the queue to it)."""


@dataclass
class EnvRoleConfig(RoleConfig):
    max_concurrency: int = ranged(64, ge=1)
    """Env calls one env worker runs at once (threads), so one hung env step blocks only its own episode."""


@dataclass
class ClusterConfig:
    engine: str = one_of("local", ("local", "ray"))
    """local: rollout, rewards, judges and envs run in the trainer processes; ray: on Ray workers placed by role."""
    address: str = checked("", lambda v: v in ("", "auto") or bool(re.fullmatch(r"(ray://)?[\w.\-]+:\d+", v)),
                           "'' (start a local Ray), 'auto', 'host:port' or 'ray://host:port'")
    """Ray cluster to join: 'auto' (the one `ray start` made on this node), 'ray://host:port', or '' to start a local
    Ray in the trainer with num_cpus CPUs and no dashboard."""
    num_cpus: int = ranged(0, ge=0)
    """CPUs of a local Ray started by address '' (0 = all of this machine's)."""
    sync: str = one_of("full", ("full", "delta"))
    """Weight push after each update: full (every tensor) or delta (only the elements that changed in the rollout
    dtype since the last push: indices and values); the workers' weights are bitwise the same either way."""
    sync_transport: str = one_of("object_store", ("object_store", "nccl"))
    """object_store: one ray.put of the weights, every worker reads it (CPU or GPU). nccl: a collective broadcast
    from trainer rank 0 to GPU workers; documented in docs/cluster.md, not built in this version (refused)."""
    startup_timeout_s: float = ranged(300.0, gt=0)
    """Longest wait for a worker to be placed and to load its model; past it the run stops naming the role."""
    call_timeout_s: float = ranged(600.0, gt=0)
    """Longest wait for one rollout/judge call or weight push; past it the worker is deemed hung, killed and restarted,
    and its work redone (reward calls use reward.timeout_s and env calls env.step_timeout_s)."""
    rollout: RolloutRoleConfig = field(default_factory=RolloutRoleConfig)
    """Rollout workers: each holds the policy in an hf or vllm backend and samples its share of a step's prompts."""
    reward: RewardRoleConfig = field(default_factory=RewardRoleConfig)
    """Reward functions as an elastic pool of stateless Ray tasks (RollArc's serverless principle)."""
    judge: RoleConfig = field(default_factory=RoleConfig)
    """LLM judges (stateful models) as a pool of actors."""
    env: EnvRoleConfig = field(default_factory=EnvRoleConfig)
    """Multi-turn environments held by env actors, so env steps leave the trainer processes."""


def _check_fields(node, path: str) -> None:
    for f in fields(node):
        key, value = f"{path}.{f.name}", getattr(node, f.name)
        if hasattr(value, "__dataclass_fields__"):
            _check_fields(value, key)
        elif "check" in f.metadata and not f.metadata["check"](value):
            raise ConfigError(f"config key '{key}' = {value!r} is out of range: expected {f.metadata['expected']}")


def check_cluster(cfg: ClusterConfig) -> None:
    """Each field's range, then the settings that cannot work together, naming the key (`cluster.*`)."""
    _check_fields(cfg, "cluster")
    if cfg.engine == "local":
        return
    for role in ROLES:
        for name in getattr(cfg, role).resources:
            if name.lower() in ("cpu", "gpu") and name not in ("CPU", "GPU"):
                raise ConfigError(f"config key 'cluster.{role}.resources' has '{name}': Ray's names are case-sensitive, "
                                  f"expected '{name.upper()}'")
    ro = cfg.rollout
    if ro.workers < 1:
        raise ConfigError("config key 'cluster.rollout.workers' = 0: expected >= 1 with cluster.engine: ray")
    el = ro.elastic
    if el.max and not 1 <= el.min <= ro.workers <= el.max:
        raise ConfigError(f"config key 'cluster.rollout.elastic' = {{min: {el.min}, max: {el.max}}} with rollout.workers="
                          f"{ro.workers}: expected 1 <= min <= workers <= max")
    if el.min and not el.max:
        raise ConfigError(f"config key 'cluster.rollout.elastic.min' = {el.min} without elastic.max: expected max >= min")
    if not ro.per_sample_seeds and (ro.workers > 1 or el.max):
        raise ConfigError("config key 'cluster.rollout.per_sample_seeds' = false: one RNG stream per call makes the tokens "
                          "depend on how prompts are split, so it needs rollout.workers: 1 and no elastic pool")
    if cfg.sync_transport == "nccl":
        if cfg.sync == "delta":
            raise ConfigError("config key 'cluster.sync' = 'delta' with sync_transport 'nccl': a delta is an index/value "
                              "list sent through the object store; NCCL broadcasts dense tensors (use sync: full)")
        if "GPU" not in resources_of(ro):
            raise ConfigError(f"config key 'cluster.sync_transport' = 'nccl' needs GPU rollout workers, but "
                              f"cluster.rollout.resources = {resources_of(ro)} asks for no GPU")
        raise ConfigError("config key 'cluster.sync_transport' = 'nccl': the collective path is documented in "
                          "docs/cluster.md but not built in this version; use object_store (works on GPU too)")


def role_request(resources: dict) -> dict:
    """Ray actor/task options for a resource request: {CPU: 1, GPU: 1, x: 2} -> num_cpus, num_gpus, resources."""
    opts = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        opts["resources"] = custom
    return opts


def check_placement(cfg: ClusterConfig, nodes: list[dict], roles: tuple[str, ...] = ROLES) -> None:
    """Raise a ConfigError naming the first role whose per-worker request no alive node can satisfy.

    Args:
        nodes: Ray's node list (`ray.nodes()`): dicts with 'Alive' and 'Resources' ({name: total}).
        roles: the roles this run uses (a single-turn run has no env role).
    """
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if not alive:
        raise ConfigError("cluster: Ray reports no alive node; check cluster.address")
    for role in roles:
        rc = getattr(cfg, role)
        if not rc.workers:
            continue
        request = resources_of(rc)
        if not any(all(node.get(k, 0) >= v for k, v in request.items()) for node in alive):
            offered = sorted({k for node in alive for k in node if not k.startswith("node:")})
            raise ConfigError(f"config key 'cluster.{role}.resources' = {request}: no node of the Ray cluster "
                              f"offers that (resources on the nodes: {', '.join(offered)}); role '{role}' cannot be placed")
