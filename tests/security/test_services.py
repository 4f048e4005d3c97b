"""Services bind to localhost and need a key (issue 56 item 6, docs/security.md): the local Ray that
`cluster.address: ''` starts (credo.distributed.ray.runtime.connect) has no dashboard, listens on the loopback
interface only, and runs with Ray's token authentication. The listeners are read from the operating system
(psutil) for every process of that Ray session, in a child process so no other test's Ray is counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.heavy  # a real Ray start: 10-30 s; the sibling below checks the call in CI
def test_the_local_ray_listens_on_loopback_only_with_token_auth_and_no_dashboard():
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, str(REPO / "tests/security/ray_local_probe.py")], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert seen["processes"] >= 3, seen  # the driver, the GCS and the raylet at least: the probe saw the session
    assert seen["listeners"], seen
    # on Linux Ray binds '::' / '0.0.0.0' unless told it is a single-machine Ray (credo's local_only)
    assert all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for ip in seen["listeners"]), seen
    assert seen["gcs"].startswith("127.0.0.1:"), seen
    assert seen["token_auth"], "Ray's token authentication is off: any client that reaches a port could run code"
    assert not seen["dashboard"], seen


def test_connect_asks_for_no_dashboard_and_a_loopback_ray(monkeypatch):
    """The call itself (no Ray started): include_dashboard=False, and Ray's single-machine mode set."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    from credo.config.sections import ClusterConfig
    from credo.distributed.ray import runtime

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr(runtime, "check_placement", lambda *a: None)
    if hasattr(runtime, "probe_address"):  # no Ray runs here: the 'auto' address is not probed in this test
        monkeypatch.setattr(runtime, "probe_address", lambda *a, **k: None)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "")  # so that teardown removes what connect sets
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    runtime.connect(ClusterConfig(engine="ray", address="", num_cpus=1))
    assert calls[0]["include_dashboard"] is False and calls[0]["address"] == "local"  # never a cluster named by
    # RAY_ADDRESS or by /tmp/ray/ray_current_cluster (2d7b4c0)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and ray_constants.ENABLE_RAY_CLUSTER is False
    calls.clear()
    runtime.connect(ClusterConfig(engine="ray", address="auto"))
    assert calls[0]["address"] == "auto"  # a given address is joined as given
