"""Run as a script: start Ray as credo does for `cluster.address: ''` (credo.distributed.ray.runtime.connect) and
print, as JSON, every TCP listening address of the processes of that Ray (the driver, GCS, raylet, agents,
workers) and the authentication mode it runs in. tests/security/test_services.py reads it."""

import json
import sys

import psutil
import ray

from credo.config.sections import ClusterConfig
from credo.distributed.ray.runtime import connect


def session_pids() -> set[int]:
    session = ray._private.worker._global_node.get_session_dir_path()
    me = psutil.Process()
    pids = {me.pid} | {c.pid for c in me.children(recursive=True)}
    for p in psutil.process_iter():
        try:
            if any(session in part for part in p.cmdline()):
                pids |= {p.pid} | {c.pid for c in p.children(recursive=True)}
        except psutil.Error:
            continue
    return pids


def main() -> None:
    connect(ClusterConfig(engine="ray", address="", num_cpus=1))
    ray.get(ray.remote(lambda: 1).remote())  # a worker started, so its listeners count too
    pids = session_pids()
    listeners = sorted({c.laddr.ip for c in psutil.net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN and c.pid in pids})
    from ray._raylet import AuthenticationMode, get_authentication_mode

    print(json.dumps({"listeners": listeners, "gcs": ray.get_runtime_context().gcs_address,
                      "token_auth": get_authentication_mode() == AuthenticationMode.TOKEN,
                      "dashboard": ray._private.worker._global_node.address_info.get("webui_url"), "processes": len(pids)}))
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
