"""A sandbox for model-written Python: `run_python(code, timeout_s=, memory_mb=)` -> `SandboxResult`.

    from credo.sandbox import run_python
    res = run_python("print(sum(range(10)))", timeout_s=2, memory_mb=128)
    res.returncode, res.stdout, res.stderr, res.timed_out, res.reason   # 0, '45\\n', '', False, 'ok'

The mechanism is bubblewrap (`credo.sandbox.bwrap` says why) plus resource limits the in-sandbox launcher sets on
itself before the program runs (`credo.sandbox._launcher`). What each limit stops, and the test that shows it, is
in docs/sandbox.md. In short:

- wall time: the host kills the sandbox `timeout_s` after the program starts (set-up, ~0.1 s on an idle host, has
  a bound of its own, STARTUP_S); CPU time: RLIMIT_CPU at ceil(timeout_s) seconds;
- memory: RLIMIT_AS of `memory_mb` per process (and at most `max_procs` processes);
- processes: RLIMIT_NPROC of `max_procs` in the sandbox's own user namespace (threads count);
- output: stdout + stderr past `max_output_bytes` kill the sandbox;
- files: RLIMIT_FSIZE of `max_file_mb` per file, and the scratch folder is a tmpfs of `scratch_mb`;
- no network (a network namespace of its own: only a loopback that nothing listens on), no view of the host's
  files but /usr (read-only), no environment but PATH/HOME/TMPDIR/LANG, no other process (a pid namespace);
- when `run_python` returns, every process the program started is gone: the pid namespace dies with its init, and
  the host checks /proc for any process left in that namespace (a `SandboxError` if one survived a SIGKILL).

`reason` is one of REASONS. It is safe to call from several threads at once, from a reward function's worker
threads and from a Ray reward worker (a plain function, no state, no preexec_fn); the thread that calls it must
live until it returns (bwrap's --die-with-parent follows the calling thread).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from credo.sandbox import bwrap
from credo.sandbox._launcher import EXIT_DISK, EXIT_FSIZE, EXIT_MEMORY, EXIT_NPROC
from credo.sandbox.pipes import Pipes

REASONS = ("ok", "error", "timeout", "memory", "nproc", "output_limit", "file_size", "disk", "killed")
"""Why a run ended: ok (exit 0); error (another exit status: an exception, sys.exit(n)); timeout (wall or CPU
time); memory (an allocation past memory_mb); nproc (a fork or thread past max_procs); output_limit (stdout +
stderr past max_output_bytes); file_size (a file past max_file_mb); disk (the scratch tmpfs full); killed (a
signal: a segfault, the program killing itself)."""

STARTUP_S = 30.0
"""Longest wait for the sandbox to be set up and its launcher to report (the program's timeout starts then)."""

_EXIT_REASONS = {EXIT_MEMORY: "memory", EXIT_NPROC: "nproc", EXIT_DISK: "disk", EXIT_FSIZE: "file_size"}


class SandboxError(RuntimeError):
    """The sandbox itself failed: bubblewrap is missing, could not set up, or a process outlived the run."""


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one `run_python`."""

    returncode: int
    """The program's exit status; -N when a signal N ended it (a kill by the host included)."""
    stdout: str
    """What it wrote to stdout (UTF-8, undecodable bytes replaced), cut at max_output_bytes."""
    stderr: str
    """What it wrote to stderr, cut the same way."""
    timed_out: bool
    """True when the wall-time or the CPU-time limit ended it."""
    reason: str
    """One of REASONS."""
    wall_s: float
    """Seconds from start to the last process gone."""


def available() -> bool:
    """Whether this host can run the sandbox (bubblewrap installed and able to make its namespaces)."""
    try:
        return run_python("pass", timeout_s=10, memory_mb=128).reason == "ok"
    except SandboxError:
        return False


def run_python(code: str, *, timeout_s: float, memory_mb: int, stdin: str | bytes | None = None,
               files: dict[str, str | bytes] | None = None, max_procs: int = 16, max_output_bytes: int = 1 << 20,
               max_file_mb: int = 16, scratch_mb: int = 64, argv: list[str] | None = None) -> SandboxResult:
    """Run `code` as `__main__` under the sandbox and return its outcome (see the module docstring).

    Args:
        code: the program's source. timeout_s: wall-clock limit (CPU time: ceil of it). memory_mb: address space
            per process. stdin: its standard input. files: name -> content, copied into its working folder
            (/scratch) before it starts; names are relative paths without '..'. max_procs: processes and threads
            at once, the launcher included. max_output_bytes: stdout + stderr together. max_file_mb: any one file.
            scratch_mb: the working folder's size. argv: sys.argv[1:].

    Raises:
        ValueError: a limit out of range or a file name that leaves the folder.
        SandboxError: bubblewrap is missing or cannot start here, or a process survived the run.
    """
    _check_limits(timeout_s=timeout_s, memory_mb=memory_mb, max_procs=max_procs, max_output_bytes=max_output_bytes,
                  max_file_mb=max_file_mb, scratch_mb=scratch_mb)
    exe = bwrap.bwrap_path()
    if exe is None:
        raise SandboxError("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` (`make install` does)")
    rlimits = {"RLIMIT_CPU": [math.ceil(timeout_s), math.ceil(timeout_s) + 1], "RLIMIT_AS": int(memory_mb) << 20,
               "RLIMIT_NPROC": int(max_procs), "RLIMIT_FSIZE": int(max_file_mb) << 20, "RLIMIT_CORE": 0,
               "RLIMIT_NOFILE": 256}
    # in /tmp, not $TMPDIR: the sandbox user must reach it, and a TMPDIR under a 0700 home it cannot
    stage = tempfile.mkdtemp(prefix="credo-sandbox-", dir=os.environ.get("CREDO_SANDBOX_STAGE", "/tmp"))
    fds = dict(zip(("ready_r", "ready_w"), os.pipe()))
    try:
        _stage(Path(stage), code, files or {})
        cfg = json.dumps({"argv": [str(a) for a in argv or []], "rlimits": rlimits, "ready_fd": fds["ready_w"]})
        cmd = bwrap.command(bwrap=exe, python=bwrap.python_path(), stage=stage, scratch_bytes=int(scratch_mb) << 20,
                            launcher_cfg=cfg)
        return _run(cmd, fds, stdin, timeout_s, max_output_bytes)
    finally:
        for fd in fds.values():
            os.close(fd)
        shutil.rmtree(stage, ignore_errors=True)


_LOWEST = {"timeout_s": 0.0, "memory_mb": 32, "max_procs": 2, "max_output_bytes": 1, "max_file_mb": 1, "scratch_mb": 1}
"""Each limit's lowest value (timeout_s must be above it; the others at least it)."""


def _check_limits(**limits) -> None:
    for name, value in limits.items():
        low = _LOWEST[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
            value > low if name == "timeout_s" else value >= low)
        if not ok:
            raise ValueError(f"run_python: {name} = {value!r}, expected a number "
                             f"{'>' if name == 'timeout_s' else '>='} {low}")


def _stage(stage: Path, code: str, files: dict) -> None:
    """Write the program, the launcher and the caller's files, readable by the sandbox user."""
    (stage / "main.py").write_text(code, encoding="utf-8")
    shutil.copy(Path(__file__).with_name("_launcher.py"), stage / "launch.py")
    for name, content in files.items():
        rel = PurePosixPath(name)
        if not name or rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"run_python: files key {name!r} must be a relative path without '..'")
        path = stage / "files" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else bytes(content))
    for root, dirs, names in os.walk(stage):
        os.chmod(root, 0o755)
        for n in names:
            os.chmod(os.path.join(root, n), 0o644)


def _run(cmd: list[str], fds: dict, stdin, timeout_s: float, max_output_bytes: int) -> SandboxResult:
    """Start bwrap, pump its pipes until it exits or a limit ends it, make sure nothing of it is left."""
    start = time.monotonic()
    try:  # bwrap passes inherited fds through: the launcher writes its pid namespace to ready_w, then closes it
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(fds["ready_w"],), env={"PATH": "/usr/bin:/bin"}, cwd="/",
                                **bwrap.start_user())
    except OSError as e:
        raise SandboxError(f"cannot start bubblewrap ({cmd[0]}): {e}") from None
    os.close(fds.pop("ready_w"))  # only the sandbox holds it now: EOF on ready_r once the launcher closes it
    pipes = Pipes(proc, fds["ready_r"], stdin, max_output_bytes)
    try:
        ended = pipes.pump(timeout_s, STARTUP_S)  # 'exit' | 'startup' | 'timeout' | 'output_limit'
    except BaseException:  # an interrupt of the caller (KeyboardInterrupt, a thread's exit) still ends the sandbox
        _kill(proc)
        proc.wait()
        pipes.close()
        raise
    if ended != "exit":
        _kill(proc)
    returncode = _status(proc.wait())
    _reap(pipes.namespace)
    out, err = pipes.close()
    if not pipes.namespace:  # the launcher never reported: bubblewrap failed to set up, or took past STARTUP_S
        why = f"no report within {STARTUP_S} s" if ended == "startup" else f"bwrap exit {returncode}"
        raise SandboxError(f"the sandbox did not start ({why}): {err.strip()[-2000:]}")
    reason = _reason(ended, returncode)
    return SandboxResult(returncode, out, err, reason == "timeout", reason, time.monotonic() - start)


def _status(code: int) -> int:
    """bwrap reports a child killed by signal N as exit 128 + N; returned as -N, as subprocess does."""
    return -(code - 128) if 128 < code < 160 else code


def _reason(ended: str, returncode: int) -> str:
    if ended != "exit":
        return ended
    if returncode == 0:
        return "ok"
    if returncode in (-signal.SIGXCPU,):
        return "timeout"
    if returncode < 0:
        return "killed"
    return _EXIT_REASONS.get(returncode, "error")


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap; --die-with-parent passes the SIGKILL to the sandbox's init, whose death empties the pid
    namespace."""
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(namespace: str | None, grace_s: float = 2.0) -> None:
    """Wait until no process of `namespace` is left (SIGKILLing any that is); SandboxError past `grace_s`."""
    if not namespace:
        return
    deadline = time.monotonic() + grace_s
    while True:
        left = in_namespace(namespace)
        if not left:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes {left} of the sandbox ({namespace}) survived a SIGKILL")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def in_namespace(namespace: str) -> list[int]:
    """pids (as this host sees them) of the live processes whose pid namespace is `namespace` ('pid:[inode]')."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == namespace and not _zombie(entry.name):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _zombie(pid: str) -> bool:
    """A zombie has exited (it holds no memory and runs nothing); bwrap's init is one until the host's init reaps
    it, since bwrap's outer process exits without waiting for it."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        state = f.read().rsplit(b")", 1)[1].split()[0]
    return state in (b"Z", b"X")


__all__ = ["REASONS", "SandboxError", "SandboxResult", "available", "in_namespace", "run_python"]
