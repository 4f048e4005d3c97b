"""The bubblewrap command line of one sandboxed run, and the user it starts as.

Why bubblewrap (Debian's `bubblewrap`, no setuid bit) and not hand-made `unshare` + a preexec function: it sets
up the namespaces and the mount tree in C before the program's first instruction, it needs no `preexec_fn` (which
is unsafe in a threaded process such as a reward worker or a Ray worker), and `--die-with-parent` ties the whole
sandbox to the process that started it.

Run as root, bubblewrap would map the sandbox user onto root (uid 0 outside), and the kernel never enforces
RLIMIT_NPROC for root's processes. So a root caller starts bwrap as an unprivileged uid (`SANDBOX_UID`, 65534,
"nobody"): bwrap then makes an unprivileged user namespace in which that uid owns nothing outside the sandbox,
has no capability outside it, and is held to RLIMIT_NPROC (counted per user namespace, so concurrent sandboxes do
not share the budget). A caller that is not root runs bwrap as itself, which the kernel limits the same way.
"""

from __future__ import annotations

import os
import shutil
import sys

SANDBOX_UID = 65534
"""The uid (and gid) a root caller starts bubblewrap as, and the uid the program sees inside."""

SYSTEM_PYTHON = "/usr/bin/python3"
"""The interpreter sandboxed programs run by default: the system one, readable by any user (a venv or pyenv
interpreter under /root is not)."""

_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level folders a merged-/usr system keeps as links into /usr (replicated, or bound read-only when real)."""


def bwrap_path() -> str | None:
    """The bwrap executable on PATH (or the Debian path), None when bubblewrap is not installed."""
    return shutil.which("bwrap") or (shutil.which("bwrap", path="/usr/bin:/bin") or None)


def python_path() -> str:
    """The sandbox's interpreter: $CREDO_SANDBOX_PYTHON, else /usr/bin/python3, else this process's base one."""
    chosen = os.environ.get("CREDO_SANDBOX_PYTHON")
    if chosen:
        return chosen
    if os.path.exists(SYSTEM_PYTHON):
        return SYSTEM_PYTHON
    return os.path.realpath(os.path.join(sys.base_prefix, "bin", "python3"))


def _system_binds(python: str) -> list[str]:
    """/usr read-only, the merged-/usr links, and the interpreter's prefix when it lives elsewhere."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in _ROOT_LINKS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    real = os.path.realpath(python)
    if not real.startswith("/usr/"):
        prefix = os.path.dirname(os.path.dirname(real))
        args += ["--ro-bind", prefix, prefix]
    return args


def command(*, bwrap: str, python: str, stage: str, scratch_bytes: int, launcher_cfg: str) -> list[str]:
    """argv of one run: every namespace unshared (user, pid, net, ipc, uts, cgroup), nested user namespaces
    refused, a fresh /proc and a minimal /dev, /usr read-only, `stage` (the program, the launcher and the
    caller's files) read-only at /input, a size-capped tmpfs at /scratch (also /tmp's stand-in and the working
    folder), an empty environment but for PATH/HOME/TMPDIR/LANG, a new session (no terminal to inject into),
    and SIGKILL to all of it when bwrap's parent dies."""
    return [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--disable-userns",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--die-with-parent", "--new-session",
        *_system_binds(python),
        "--proc", "/proc", "--dev", "/dev",
        "--ro-bind", stage, "/input",
        "--size", str(scratch_bytes), "--perms", "0700", "--tmpfs", "/scratch",
        "--symlink", "/scratch", "/tmp",
        # bwrap's root and /dev (with /dev/shm in it) are tmpfs without a size: read-only, so the size-capped
        # /scratch is the one place to write (POSIX shared memory is not available)
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--chdir", "/scratch",
        "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/scratch", "--setenv", "TMPDIR", "/scratch", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        python, "-I", "/input/launch.py", launcher_cfg,
    ]


def start_user() -> dict:
    """Popen's user/group arguments: drop a root caller to SANDBOX_UID (done by _posixsubprocess in C between fork
    and exec, safe in a threaded process); a caller that is not root keeps its own uid."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
