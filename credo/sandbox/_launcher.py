"""The first Python to run inside the sandbox (never imported by credo: its text is copied in as /input/launch.py).

It runs as the sandbox user under `python -I` (isolated mode: no PYTHON* variables, no user site, no script
folder on sys.path). It copies the caller's files into the scratch folder, lowers its own resource limits (a
lowered hard limit cannot be raised again by the program, and every process it forks inherits it), tells the
host the sandbox's pid namespace on the ready pipe (closed before the program runs), then runs the program
as `__main__`. Failures the host cannot tell from an exit code alone are mapped to exit codes of their own:

    EXIT_MEMORY  a MemoryError (RLIMIT_AS refused an allocation)
    EXIT_NPROC   fork/clone/thread start refused with EAGAIN (RLIMIT_NPROC)
    EXIT_DISK    no space left on the scratch tmpfs (ENOSPC / EDQUOT)
    EXIT_FSIZE   a file past RLIMIT_FSIZE (EFBIG; CPython ignores SIGXFSZ, so the write fails instead)

A program can exit with these codes itself: the reason is a metric, never a pass.
"""

import errno
import json
import os
import resource
import shutil
import sys
import traceback

EXIT_MEMORY, EXIT_NPROC, EXIT_DISK, EXIT_FSIZE = 120, 121, 122, 123


def _copy_files() -> None:
    src = "/input/files"
    if os.path.isdir(src):
        for name in os.listdir(src):
            path = os.path.join(src, name)
            (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join("/scratch", name))


def _limit(cfg: dict) -> None:
    for name, value in cfg.items():
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _code_of(exc: BaseException) -> int:
    if isinstance(exc, MemoryError):
        return EXIT_MEMORY
    if isinstance(exc, OSError):
        if exc.errno == errno.EAGAIN:
            return EXIT_NPROC
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return EXIT_DISK
        if exc.errno == errno.EFBIG:
            return EXIT_FSIZE
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return EXIT_NPROC
    return 1


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _copy_files()
    _limit(cfg["rlimits"])
    ready = os.fdopen(cfg["ready_fd"], "w")
    ready.write(os.readlink("/proc/self/ns/pid"))
    ready.close()
    sys.argv = ["main.py", *cfg["argv"]]
    sys.path.insert(0, "/scratch")
    with open("/input/main.py", encoding="utf-8") as f:
        code = f.read()
    scope = {"__name__": "__main__", "__file__": "/scratch/main.py", "__builtins__": __builtins__}
    try:
        exec(compile(code, "main.py", "exec"), scope)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure of the program becomes an exit code
        status = _code_of(exc)
        try:
            if status == EXIT_MEMORY:
                os.write(2, b"MemoryError\n")
            else:
                traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the program's frame
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a broken stream must not hide the status
            pass
        os._exit(status)


if __name__ == "__main__":
    main()
