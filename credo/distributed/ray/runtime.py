"""What every role shares: connecting to Ray, a supervised group of actors, worker-loss detection, role metrics.

A `WorkerGroup` holds one role's actors by slot. A worker that dies (killed, crashed, its node lost) or hangs
past a timeout is replaced in the same slot and counted; past `max_restarts` replacements over the run the
group raises `ClusterWorkerError` naming the role. Ray's own actor restarts and task retries are off
(max_restarts=0, max_task_retries=0): the caller redoes the lost work itself, with the same seeds, so it can
count restarts and put its current weights or env state back first. Every wait has a timeout.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

from credo.distributed.ray.config import ClusterConfig, check_placement, role_request
from credo.errors import ConfigError, UserError

log = logging.getLogger("credo.cluster")


TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
"""The logger of Ray's 'Token authentication is enabled for this Ray cluster' warning, printed at every ray.init."""


class ClusterWorkerError(UserError, RuntimeError):
    """A role cannot keep its workers: they keep dying, or they are not placed or ready in time."""


def connect(cfg: ClusterConfig, *, roles: tuple[str, ...] = (), verbose: bool = False) -> float:
    """Start or join Ray as `cluster.address` says, then check that every role in `roles` can be placed
    (`check_placement`: a ConfigError naming the role, before any worker starts). Returns the seconds it took.

    '' starts a local Ray with cluster.num_cpus CPUs (all when 0), no dashboard, listening on the loopback
    interface only (`local_only`); 'auto', 'host:port' or 'ray://host:port' joins a running cluster; a process
    already connected stays so. Ray (2.52+) asks every client for its token (RAY_AUTH_MODE=token, the key in
    ~/.ray/auth_token) unless RAY_AUTH_MODE=disabled. Ray's worker logs reach the driver only when `verbose`.
    """
    import ray

    t0 = time.perf_counter()
    if not verbose:  # Ray's token-authentication notice on every start: Ray's own lines only with run.verbose
        logging.getLogger(TOKEN_AUTH_LOGGER).setLevel(logging.ERROR)
    if not ray.is_initialized():
        quiet = dict(log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.WARNING)
        if cfg.address:
            probe_address(cfg.address)
            try:
                ray.init(address=cfg.address, **quiet)
            except ConnectionError as e:  # Ray's own message names flags credo does not have (--address)
                raise join_error(cfg.address, e) from None
        else:
            # Ray renices its workers by 15 by default (background work); here they are the step's critical path
            os.environ.setdefault("RAY_worker_niceness", "0")
            local_only()
            # "local", not None: ray.init(address=None) joins whatever RAY_ADDRESS or /tmp/ray/ray_current_cluster
            # names (`ray start` and ray.cluster_utils.Cluster write it), and then refuses num_cpus
            ray.init(address="local", num_cpus=cfg.num_cpus or os.cpu_count(), include_dashboard=False, **quiet)
    check_placement(cfg, ray.nodes(), roles)
    return time.perf_counter() - t0


def not_started_error(role: str, what: str, queued: int, resources: dict, timeout_s: float,
                      hint: str) -> ClusterWorkerError:
    """Queued Ray tasks of `role` that no node started within cluster.startup_timeout_s: what they ask, what the
    cluster offers in all and free, and `hint` (which key to lower)."""
    import ray

    from credo.distributed.ray.config import _fmt

    total, free = ray.cluster_resources(), ray.available_resources()
    return ClusterWorkerError(
        f"role '{role}': {queued} {what} task(s) asking for {_fmt(resources)} did not start within "
        f"cluster.startup_timeout_s = {timeout_s} s; the cluster offers "
        f"{_fmt({k: total.get(k, 0.0) for k in resources})} in all, "
        f"{_fmt({k: free.get(k, 0.0) for k in resources})} free (the other roles' workers hold the rest): {hint}")


def join_error(address: str, e: BaseException) -> ConfigError:
    """`ray.init(address=...)`'s ConnectionError as one line naming cluster.address. A cluster that refused this
    client's token says so only in the error's cause (and in Ray's log lines): Ray sends its token on its own only
    for 'auto' (a cluster `ray start` recorded on this node), so joining `host:port` or `ray://...` of a cluster with
    token authentication (`ray start`'s default since Ray 2.52) needs RAY_AUTH_MODE=token here (issue 57's round-4
    trial: credo said 'start one with `ray start --head`' to a user whose cluster was up)."""
    causes, c = [], e
    while c is not None and len(causes) < 8:
        causes.append(str(c))
        c = c.__cause__ or c.__context__
    where = f"config key 'cluster.address' = '{address}'"
    if any("InvalidAuthToken" in text or "Unauthenticated" in text for text in causes):
        mode = os.environ.get("RAY_AUTH_MODE", "")
        fix = ("its token is not the one this client sent: use the cluster's token (~/.ray/auth_token on its head "
               "node) in ~/.ray/auth_token or RAY_AUTH_TOKEN" if mode.lower() == "token" else
               "set RAY_AUTH_MODE=token and give this client the cluster's token (~/.ray/auth_token on its head node, "
               "or RAY_AUTH_TOKEN); Ray sends it on its own only for cluster.address=auto")
        return ConfigError(f"{where}: the Ray cluster there refused this client (token authentication): {fix}")
    return ConfigError(f"{where}: cannot join the Ray cluster ({str(e).splitlines()[0]}); start one with `ray start "
                       "--head`, or set cluster.address='' to start a local Ray")


def probe_address(address: str, timeout_s: float = 3.0) -> None:
    """A ConfigError naming cluster.address when no Ray listens there, found in seconds (before any warm-up): 'auto'
    resolves as `ray.init` does (RAY_ADDRESS, then the cluster `ray start` recorded on this node), then the address's
    port must accept a TCP connection."""
    import socket

    where = address
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # a Ray without it: ray.init reports it at start-up (also as a ConfigError)
            return
        try:
            where = canonicalize_bootstrap_address("auto") or ""
        except (ConnectionError, ValueError):
            where = ""
        if not where:
            raise ConfigError("config key 'cluster.address' = 'auto': no running Ray cluster found on this machine "
                              "(start one with `ray start --head`, or set cluster.address='' to start a local Ray)")
    host, _, port = where.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"config key 'cluster.address' = '{address}': no Ray answers at {where} ({e}); start one "
                          "with `ray start --head`, or set cluster.address='' to start a local Ray") from None


def placement_report(wanted: int, placed: int, resources: dict) -> str:
    """'2 of 3 worker(s) asking for {CPU: 1} were placed; the cluster offers {CPU: 2} in all, {CPU: 0} free'."""
    import ray

    from credo.distributed.ray.config import _fmt

    total = {k: float(v) for k, v in ray.cluster_resources().items() if k in resources}
    free = {k: float(v) for k, v in ray.available_resources().items() if k in resources}
    return (f"{placed} of {wanted} worker(s) asking for {_fmt(resources)} were placed and ready; the cluster offers "
            f"{_fmt({k: total.get(k, 0.0) for k in resources})} in all, {_fmt({k: free.get(k, 0.0) for k in resources})} "
            "free")


def local_only() -> None:
    """Make the Ray this process starts listen on 127.0.0.1 only. On Linux Ray treats every start as a node of a
    possible cluster and binds its GCS, raylet and workers to every interface; Ray's single-machine mode (its
    default on macOS and Windows, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) binds them to the loopback address.
    Set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 to start a head node that others can join (docs/cluster.md)."""
    from ray._private import ray_constants

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the raylet and workers read it at start
    # ray read the variable when it was imported (maybe before this call): its constant is what it consults
    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"].lower() in ("1", "true")


def loss_errors() -> tuple[type, ...]:
    """The Ray errors that mean a worker (or its node) is gone, not that the user's code raised."""
    from ray import exceptions as rx

    return (rx.RayActorError, rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError, rx.OutOfMemoryError)


def user_error(err: BaseException) -> BaseException:
    """The exception the user's code raised inside a worker (Ray wraps it in a RayTaskError)."""
    from ray.exceptions import RayTaskError

    if isinstance(err, RayTaskError) and getattr(err, "cause", None) is not None:
        err = err.cause
    # an engine in the worker (vLLM) often says only "see the stack trace above", which is in the worker's own log
    if not any("worker's own log" in n for n in getattr(err, "__notes__", ())):
        err.add_note(f"the worker's own log (its stack trace): {worker_logs()}; run.verbose=true prints it here")
    return err


def worker_logs() -> str:
    """Where this Ray session writes its workers' stdout and stderr."""
    try:
        import ray

        if ray.is_initialized():  # (asking the runtime context would start a Ray)
            return str(ray._private.worker.global_worker.node.get_logs_dir_path())
    except Exception:  # Ray's private layout moved: the default place
        pass
    return "/tmp/ray/session_latest/logs"


class RoleStats:
    """Per role, over the window since the last `read`: busy fraction, peak queue depth, restarts."""

    def __init__(self, role: str):
        self.role = role
        self._lock = threading.Lock()
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.window_start, self.busy_s, self.queue_peak, self.restarts = now, 0.0, 0, 0

    def busy(self, seconds: float) -> None:
        with self._lock:
            self.busy_s += seconds

    def queue(self, depth: int) -> None:
        with self._lock:
            self.queue_peak = max(self.queue_peak, depth)

    def restarted(self) -> None:
        with self._lock:
            self.restarts += 1

    def read(self, workers: int) -> dict:
        """`cluster/<role>_*` for the window, which then starts anew; busy_frac = busy worker-seconds / (workers x wall)."""
        with self._lock:
            now = time.monotonic()
            wall = now - self.window_start
            r = self.role
            out = {f"cluster/{r}_workers": workers, f"cluster/{r}_queue_depth": self.queue_peak,
                   f"cluster/{r}_busy_frac": min(1.0, self.busy_s / (workers * wall)) if workers and wall > 0 else 0.0,
                   f"cluster/{r}_restarts": self.restarts}
            self._reset(now)
        return out


def cluster_metrics(*parts: dict) -> dict:
    """Merge components' `metrics()` and add `cluster/worker_restarts`, the sum over roles."""
    out: dict = {}
    for p in parts:
        out.update(p)
    out["cluster/worker_restarts"] = sum(v for k, v in out.items() if k.endswith("_restarts") and k != "cluster/worker_restarts")
    return out


class WorkerGroup:
    """One role's actors, by slot: started together, replaced one at a time, each replacement counted.

    Args:
        role: the role's name, used in errors and metrics.
        cls: the worker class (plain Python; made a Ray actor here), built with `args`/`kwargs`; it must have
            `ready()` returning a dict (where it runs: node id, pid).
        resources: the role's request per worker ({CPU: 1}, {GPU: 1}, {decode_gpu: 1}).
        max_restarts: replacements allowed over the group's life.
        startup_timeout_s: longest wait for one worker to be placed and built.
        max_concurrency: calls one actor runs at once (threads); None = one at a time.
    """

    def __init__(self, role: str, cls: type, *, args: tuple = (), kwargs: dict | None = None, resources: dict,
                 max_restarts: int, startup_timeout_s: float, max_concurrency: int | None = None):
        import ray

        self.role, self.resources = role, dict(resources)
        self.args, self.kwargs = args, dict(kwargs or {})
        self.max_restarts, self.startup_timeout_s = max_restarts, startup_timeout_s
        options = dict(role_request(self.resources), max_restarts=0, max_task_retries=0)
        if max_concurrency:
            options["max_concurrency"] = max_concurrency
        self.actor_cls = ray.remote(cls).options(**options)
        self.handles: dict[int, object] = {}
        self.info: dict[int, dict] = {}
        self.restarts = 0
        self.failed: ClusterWorkerError | None = None  # set once the role ran out of restarts: every later use raises
        self.stats = RoleStats(role)
        self.lock = threading.RLock()
        self._slots = itertools.count()

    def start(self, n: int) -> list[int]:
        """Create n workers at once and wait until all are ready; their slots, in order."""
        handles = [self.actor_cls.remote(*self.args, **self.kwargs) for _ in range(n)]
        infos = self._wait_ready(handles)
        slots = []
        with self.lock:
            for h, info in zip(handles, infos):
                slot = next(self._slots)
                self.handles[slot], self.info[slot] = h, info
                slots.append(slot)
        return slots

    def _wait_ready(self, handles: list, *, lost_ok: bool = False) -> list[dict]:
        """Each worker's `ready()` within startup_timeout_s. A worker that dies while starting is a
        ClusterWorkerError naming the role, or, with `lost_ok`, the Ray loss error itself (for `replace` to count)."""
        import ray
        from ray.exceptions import GetTimeoutError

        refs = [h.ready.remote() for h in handles]
        try:
            return ray.get(refs, timeout=self.startup_timeout_s)
        except GetTimeoutError:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            report = placement_report(len(handles), len(ready), self.resources)
            for h in handles:
                ray.kill(h)
            raise ClusterWorkerError(
                f"role '{self.role}': {report}, within cluster.startup_timeout_s = {self.startup_timeout_s} s (no free "
                "node offers the rest, or loading is slower than that)") from None
        except loss_errors() as e:
            if lost_ok:
                raise
            raise ClusterWorkerError(f"role '{self.role}': a worker died while starting: {e}") from None

    def replace(self, slot: int, seen, cause: BaseException | str) -> object:
        """Replace the worker in `slot` that the caller saw fail (`seen`, its handle); count it; the new handle.

        If another caller already replaced it, the current handle is returned and nothing is counted. A replacement
        that dies while starting (its process killed, its constructor crashing it) is one more restart, replaced in
        turn, so a role's cap bounds every loss alike.

        Raises:
            ClusterWorkerError: past max_restarts replacements, naming the role.
        """
        import ray

        with self.lock:
            self.check()
            current = self.handles.get(slot)
            if current is not seen and current is not None:
                return current
            while True:
                self.restarts += 1
                self.stats.restarted()
                if self.restarts > self.max_restarts:
                    self.failed = ClusterWorkerError(
                        f"role '{self.role}': its workers were lost {self.restarts} times, more than cluster."
                        f"{self.role}.max_restarts = {self.max_restarts}; last cause: {cause}")
                    raise self.failed
                log.warning("role '%s': worker in slot %d lost (%s); restarting it and redoing its work", self.role,
                            slot, str(cause).splitlines()[0] if str(cause) else type(cause).__name__)
                if seen is not None:
                    ray.kill(seen)
                handle = self.actor_cls.remote(*self.args, **self.kwargs)
                try:
                    self.info[slot] = self._wait_ready([handle], lost_ok=True)[0]
                except loss_errors() as e:
                    seen, cause = handle, f"its replacement died while starting: {e}"
                    continue
                self.handles[slot] = handle
                return handle

    def check(self) -> None:
        """Raise the role's `ClusterWorkerError` again once it ran out of restarts (a caller that swallowed it, such
        as a thread of the multi-turn source, does not keep the run going on a broken role)."""
        if self.failed is not None:
            raise self.failed

    def remove(self, slot: int) -> None:
        """Stop the worker in `slot` (a leaving worker: not counted as a restart)."""
        import ray

        with self.lock:
            handle = self.handles.pop(slot, None)
            self.info.pop(slot, None)
        if handle is not None:
            ray.kill(handle)

    def close(self, grace_s: float = 30.0) -> None:
        """Stop every worker: each first runs its own `close()` (a vLLM engine stops its child processes), for at most
        `grace_s` seconds in all, then is killed."""
        import ray

        handles = list(self.handles.values())
        done = [h.close.remote() for h in handles if hasattr(h, "close")]
        if done:
            ray.wait(done, num_returns=len(done), timeout=grace_s)
        for slot in list(self.handles):
            self.remove(slot)
