"""Issue 57 A.1-A.3: a Ray run whose roles cannot all fit the cluster is refused by `credo check` (never a hang), a
`cluster.address` with no Ray behind it is one ConfigError naming the key, found before any warm-up. No Ray runs
here (node lists shaped like `ray.nodes()`); tests/ray/test_capacity_live.py replays the waits on a real Ray."""

from __future__ import annotations

import socket

import pytest

from credo.config import ConfigError, load_recipe
from credo.distributed.ray.config import (ClusterConfig, RewardRoleConfig, RoleConfig, RolloutRoleConfig,
                                          check_capacity, run_roles)

QUICK = "recipes/quickstart.yaml"


def nodes(*cpus: float) -> list[dict]:
    return [{"Alive": True, "Resources": {"CPU": c, f"node:10.0.0.{i}": 1.0}} for i, c in enumerate(cpus)]


def naive_need(cfg: ClusterConfig, roles) -> float:
    """CPUs the roles hold at once, written out role by role: actors for the run, the reward pool one task."""
    total = 0.0
    if "rollout" in roles:
        total += cfg.rollout.workers * cfg.rollout.resources.get("CPU", 1)
    if "judge" in roles:
        total += cfg.judge.workers * cfg.judge.resources.get("CPU", 1)
    if "reward" in roles:
        total += cfg.reward.resources.get("CPU", 1)
    return total


@pytest.mark.parametrize("workers,cpus,roles", [
    (2, 2, ("rollout", "reward")),  # the hang: the two actors hold both CPUs, no reward task can start
    (3, 2, ("rollout", "reward")),
    (1, 1, ("rollout", "reward")),
    (1, 2, ("rollout", "reward")),
    (2, 2, ("rollout",)),
    (1, 4, ("rollout", "reward", "judge")),
    (2, 4, ("rollout", "reward", "judge")),
])
def test_the_sum_over_roles_is_checked_against_the_cluster(workers, cpus, roles):
    cfg = ClusterConfig(engine="ray", rollout=RolloutRoleConfig(workers=workers), judge=RoleConfig(workers=2))
    fits = naive_need(cfg, roles) <= cpus
    if fits:
        check_capacity(cfg, nodes(cpus), roles)
    else:
        with pytest.raises(ConfigError, match=r"cluster.rollout.workers' = %d.*CPU: %g\} in all.*offers \{CPU: %g\}"
                           % (workers, naive_need(cfg, roles), cpus)):
            check_capacity(cfg, nodes(cpus), roles, key="cluster.num_cpus")


def test_fractions_and_several_nodes_fit_and_the_reward_cap_is_a_note():
    cfg = ClusterConfig(engine="ray", rollout=RolloutRoleConfig(workers=2, resources={"CPU": 0.5}))
    notes = check_capacity(cfg, nodes(2), ("rollout", "reward"))
    assert notes == ["cluster.reward.workers = 4: beside the actors the cluster has room for 1 reward task(s) of "
                     "{CPU: 1} at once; the pool runs that many"]
    assert check_capacity(cfg, nodes(2, 4), ("rollout", "reward")) == []  # 6 CPUs: 1 held, 4 tasks fit
    cfg.reward = RewardRoleConfig(workers=4, resources={"reward_node": 1})
    with pytest.raises(ConfigError, match="reward_node: 1"):
        check_capacity(cfg, nodes(8), ("rollout", "reward"))


def check(overrides: list[str]) -> list[str]:
    from credo.preflight import preflight

    return list(preflight(load_recipe(QUICK, overrides)).notes)


def test_credo_check_refuses_two_rollout_workers_on_two_cpus():
    with pytest.raises(ConfigError, match=r"cluster.rollout.workers' = 2.*\{CPU: 3\} in all.*raise cluster.num_cpus"):
        check(["cluster.engine=ray", "cluster.rollout.workers=2", "cluster.num_cpus=2"])
    with pytest.raises(ConfigError, match=r"offers \{CPU: 1\}"):
        check(["cluster.engine=ray", "cluster.num_cpus=1"])
    notes = check(["cluster.engine=ray", "cluster.num_cpus=2"])
    assert any("room for 1 reward task" in n for n in notes)
    # a reward stage other than the default pool uses no reward role: two workers fit
    assert run_roles(load_recipe(QUICK, ["cluster.engine=ray"])) == ("rollout", "reward")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "auto"])
def test_an_address_with_no_ray_is_one_config_error_naming_it(address, monkeypatch):
    pytest.importorskip("ray")
    port = free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # what 'auto' resolves to first, as ray.init does
    address = address.format(port=port)
    with pytest.raises(ConfigError, match=r"^config key 'cluster.address' = '%s'.*no Ray answers" % address) as e:
        check(["cluster.engine=ray", f"cluster.address={address}"])
    assert "\n" not in str(e.value) and "--address" not in str(e.value)


def test_credo_check_off_the_cluster_warns_that_the_run_would_stop():
    from credo.distributed.ray.config import address_probe_as_note, check_at_preflight

    port = free_port()
    r = load_recipe(QUICK, ["cluster.engine=ray", f"cluster.address=127.0.0.1:{port}"])
    with address_probe_as_note():  # what `credo check` runs under (credo.cli._check)
        notes = check_at_preflight(r)
    assert notes[0].startswith(f"warning: config key 'cluster.address' = '127.0.0.1:{port}': no Ray answers")
    assert notes[0].endswith("`credo run` stops there, before its warm-up, unless that cluster is up by then")
    with pytest.raises(ConfigError, match="no Ray answers"):  # outside it, as `credo run` and credo.train meet it
        check_at_preflight(r)


def _refused(address: str, monkeypatch, cause: str) -> str:
    """connect() to a Ray that answers but whose ray.init fails as Ray 2.60's does: a ConnectionError whose cause
    holds the reason (here no Ray runs: ray.init and the port probe are stand-ins)."""
    import ray

    from credo.distributed.ray import runtime

    def init(**kw):
        try:
            raise RuntimeError(cause)
        except RuntimeError as e:
            raise ConnectionError(f"Failed to connect to Ray cluster at {kw['address']}") from e

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(runtime, "probe_address", lambda address: None)
    with pytest.raises(ConfigError) as e:
        runtime.connect(ClusterConfig(engine="ray", address=address))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_cluster_that_refuses_the_token_is_named_as_such(monkeypatch):
    """Round-4 trial: `ray start --head` (token authentication on, Ray 2.60's default) and cluster.address=HOST:PORT:
    Ray sends no token for an explicit address unless RAY_AUTH_MODE=token, the cluster refuses the client, and credo
    said 'cannot join ...; start one with `ray start --head`' to a user whose cluster was up."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    auth = ("Failed to connect to GCS. Last connection error: ... RPC error: InvalidAuthToken: Authentication token "
            "is missing or incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token').")
    msg = _refused("10.0.0.1:6379", monkeypatch, auth)
    assert msg.startswith("config key 'cluster.address' = '10.0.0.1:6379': the Ray cluster there refused this client "
                          "(token authentication): set RAY_AUTH_MODE=token"), msg
    assert "ray start --head" not in msg
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the mode set, the token wrong
    assert "its token is not the one this client sent" in _refused("10.0.0.1:6379", monkeypatch, auth)
    other = _refused("10.0.0.1:6379", monkeypatch, "Failed to connect to GCS within 60 seconds")  # anything else
    assert other.startswith("config key 'cluster.address' = '10.0.0.1:6379': cannot join the Ray cluster (Failed to "
                            "connect to Ray cluster at 10.0.0.1:6379); start one with `ray start --head`"), other


@pytest.mark.parametrize("address,logged", [("", False), ("auto", True)])
def test_the_reward_pool_note_is_logged_once(address, logged, monkeypatch, caplog):
    """Round-4 trial: every local Ray run logged 'cluster.reward.workers = 4: beside the actors the cluster has room
    for 1 reward task(s) ...' twice, at the preflight and again at start-up against the same CPUs. The start-up check
    logs it only for a cluster the preflight could not see (cluster.address set); it still refuses what cannot fit."""
    import logging

    import ray

    from credo.train.cluster import check_live_capacity

    monkeypatch.setattr(ray, "nodes", lambda: nodes(2))
    over = ["cluster.engine=ray", f"cluster.address={address}"]
    with caplog.at_level(logging.INFO, logger="credo.cluster"):
        check_live_capacity(load_recipe(QUICK, over))
    notes = [r.getMessage() for r in caplog.records if "beside the actors" in r.getMessage()]
    assert len(notes) == int(logged), notes
    with pytest.raises(ConfigError, match="cluster.rollout.workers"):
        check_live_capacity(load_recipe(QUICK, [*over, "cluster.rollout.workers=2"]))
