"""Adversarial programs through `credo.sandbox.run_python`: each is contained, reported with its reason, returns
within its limit + 2 s, and leaves no process behind (no /proc/*/cmdline holds the run's unique marker, which the
launcher and everything it forks carry in argv). The attack table of docs/sandbox.md points at these tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from credo import sandbox
from credo.sandbox import SandboxError, run_python

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot run here (make install adds it)")

SLACK_S = 2.0
"""Every run returns within its own limit plus this."""


def _holders(marker: str) -> list[int]:
    """pids of live processes whose command line holds `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def contained(code: str, *, timeout_s: float = 2.0, memory_mb: int = 128, **kw):
    """Run `code` with a unique marker in its argv; assert it returned in time and left no process."""
    marker = f"credo-sbx-test-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    res = run_python(textwrap.dedent(code), timeout_s=timeout_s, memory_mb=memory_mb, argv=[marker], **kw)
    elapsed = time.monotonic() - t0
    assert elapsed <= timeout_s + SLACK_S, f"returned after {elapsed:.2f} s (limit {timeout_s} s)"
    assert not _holders(marker), "a process of the sandbox outlived run_python"
    assert res.reason in sandbox.REASONS
    return res


def test_a_plain_program_gets_stdin_files_argv_and_its_output():
    res = contained("""
        import sys
        print(sys.stdin.read().upper(), open('data/in.txt').read(), sys.argv[1].startswith('credo-sbx-test-'))
        print('to stderr', file=sys.stderr)
        """, stdin="hello", files={"data/in.txt": "file content"})
    assert (res.reason, res.returncode, res.timed_out) == ("ok", 0, False)
    assert res.stdout == "HELLO file content True\n" and res.stderr == "to stderr\n"


def test_an_exception_is_an_error_with_the_programs_traceback():
    res = contained("def f():\n    return 1 / 0\nf()\n")
    assert (res.reason, res.returncode) == ("error", 1)
    assert "ZeroDivisionError" in res.stderr and 'File "main.py", line 2' in res.stderr and "launch" not in res.stderr


def test_fork_bomb_is_stopped_by_the_process_limit():
    res = contained("import os\nwhile True:\n    os.fork()\n", max_procs=16)
    assert res.reason == "nproc" and "BlockingIOError" in res.stderr


def test_fork_bomb_that_swallows_the_error_is_killed_at_the_wall_limit():
    res = contained("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """, timeout_s=0.5, max_procs=16)
    assert res.reason == "timeout" and res.timed_out


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"], ids=["busy", "sleep"])
def test_infinite_loop_times_out(code):
    res = contained(code, timeout_s=0.5)
    assert (res.reason, res.timed_out, res.returncode) == ("timeout", True, -signal.SIGKILL)


def test_the_resource_limits_are_installed_and_cannot_be_raised():
    res = contained("""
        import resource
        names = ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CORE')
        print([resource.getrlimit(getattr(resource, n)) for n in names])
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))
            print('raised')
        except ValueError as e:
            print('refused', e)
        """, timeout_s=2.5, memory_mb=96, max_procs=8, max_file_mb=3)
    mb = 1 << 20
    assert res.stdout.splitlines() == [str([(3, 4), (96 * mb, 96 * mb), (8, 8), (3 * mb, 3 * mb), (0, 0)]),
                                       "refused not allowed to raise maximum limit"], res.stderr


def test_the_cpu_time_limit_is_reported_as_a_timeout():
    """SIGXCPU (here at a soft limit the program lowered to 1 s) is a timeout, as the host's wall clock is."""
    res = contained("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 4))\nwhile True:\n    pass\n",
                    timeout_s=8.0)  # 1 s of CPU takes longer on a loaded host; the wall limit must not come first
    assert (res.reason, res.timed_out, res.returncode) == ("timeout", True, -signal.SIGXCPU)


@pytest.mark.parametrize("code", ["x = bytearray(10 ** 9)\n",
                                  "chunks = []\nwhile True:\n    chunks.append(' ' * 10 ** 6)\n"],
                         ids=["one-allocation", "growing"])
def test_memory_bomb_is_refused(code):
    res = contained(code, memory_mb=128)
    assert (res.reason, res.timed_out) == ("memory", False)


def test_a_gigabyte_of_output_is_cut_at_the_output_limit():
    res = contained("""
        import sys
        chunk = 'x' * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(chunk)
        """, max_output_bytes=1 << 20)
    assert res.reason == "output_limit" and len(res.stdout) + len(res.stderr) <= 1 << 20


def test_no_write_outside_scratch_and_no_read_of_a_secret_file(tmp_path):
    secret = f"SECRET-{uuid.uuid4().hex}"
    (tmp_path / "secret.txt").write_text(secret)
    os.chmod(tmp_path, 0o755)  # readable by anyone on the host: only the sandbox's view of files protects it
    os.chmod(tmp_path / "secret.txt", 0o644)
    marker = tmp_path / "written-by-sandbox"
    targets = [marker, Path("/tmp") / marker.name, Path(__file__).parent / marker.name, Path("/root") / marker.name]
    res = contained(f"""
        import os, subprocess
        for path in {[str(t) for t in targets]!r}:
            try:
                open(path, 'w').write('pwned')
                print('WROTE', path)
            except OSError as e:
                print('refused', path, type(e).__name__)
        for path in [{str(tmp_path / 'secret.txt')!r}, '/root/.bashrc', '/etc/shadow', '/etc/passwd', {__file__!r}]:
            try:
                print(open(path).read())
            except OSError as e:
                print('unreadable', path, type(e).__name__)
        print(subprocess.run(['cat', {str(tmp_path / 'secret.txt')!r}], capture_output=True, text=True))
        """)
    assert res.reason == "ok", res.stderr
    assert "WROTE /tmp/" in res.stdout  # /tmp is the scratch tmpfs inside: nothing reaches the host's /tmp
    assert not any(t.exists() for t in targets), "a file was written outside the scratch folder"
    assert secret not in res.stdout + res.stderr
    assert res.stdout.count("unreadable") == 5


def test_the_environment_is_scrubbed(monkeypatch):
    secret = f"SECRET-{uuid.uuid4().hex}"
    for name in ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "MY_OWN_VAR"):
        monkeypatch.setenv(name, secret)
    res = contained("""
        import os
        print(dict(os.environ))
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                for part in ('environ', 'cmdline'):
                    try:
                        print(pid, part, open(f'/proc/{pid}/{part}', 'rb').read())
                    except OSError as e:
                        print(pid, part, type(e).__name__)
        """)
    assert res.reason == "ok", res.stderr
    assert "WANDB" not in res.stdout and secret not in res.stdout + res.stderr
    assert "/proc/1" not in res.stdout and "1 environ" in res.stdout  # it could look: nothing was there


def test_no_tcp_connection_reaches_a_host_listener():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    try:
        res = contained(f"""
            import socket
            for host in ('127.0.0.1', 'localhost', '10.0.2.2', '8.8.8.8'):
                try:
                    socket.create_connection((host, {port}), timeout=0.5)
                    print('CONNECTED', host)
                except OSError as e:
                    print('refused', host, type(e).__name__)
            print(socket.if_nameindex())
            """)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert res.reason == "ok", res.stderr
    assert "CONNECTED" not in res.stdout and res.stdout.count("refused") == 4
    assert "'lo'" in res.stdout and "eth" not in res.stdout  # a network namespace with only its own loopback


def test_killing_the_parent_and_host_processes_fails():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        res = contained(f"""
            import os, signal
            for pid in (os.getppid(), 1, {os.getpid()}, {victim.pid}):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print('sent', pid)
                except OSError as e:
                    print('refused', pid, type(e).__name__)
            print('still here')
            """)
        time.sleep(0.1)
        assert victim.poll() is None, "the sandbox killed a host process"
    finally:
        victim.kill()
        victim.wait()
    assert res.reason == "ok" and "still here" in res.stdout, res.stderr  # SIGKILL to a pid namespace's init is dropped


def test_kill_of_every_process_it_can_see_reaches_only_the_sandbox():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        res = contained("""
            import os, signal, time
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
            os.kill(-1, signal.SIGKILL)  # every process it may signal but itself and the namespace's init
            print('child ended by signal', os.WEXITSTATUS(0) or os.WTERMSIG(os.waitpid(child, 0)[1]))
            """)
        time.sleep(0.1)
        assert victim.poll() is None, "the sandbox killed a host process"
    finally:
        victim.kill()
        victim.wait()
    assert res.reason == "ok" and res.stdout == f"child ended by signal {int(signal.SIGKILL)}\n", res.stderr


def test_a_double_forked_setsid_daemon_does_not_outlive_the_run():
    t0 = time.monotonic()
    res = contained("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for fd in (0, 1, 2):
                    os.close(fd)
                os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', *sys.argv])
            os._exit(0)
        time.sleep(0.3)
        print('parent exits')
        """, timeout_s=5.0)
    assert (res.reason, res.stdout) == ("ok", "parent exits\n")
    assert time.monotonic() - t0 < 3.0  # the run ends with its main process, not at the time limit


def test_filling_the_disk_stops_at_the_scratch_size():
    res = contained("""
        i = 0
        while True:
            with open(f'f{i}', 'wb') as f:
                f.write(b'x' * (1 << 20))
            i += 1
        """, scratch_mb=8, max_file_mb=4)
    assert res.reason == "disk" and "No space left" in res.stderr


def test_one_huge_file_stops_at_the_file_size_limit():
    res = contained("with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
                    scratch_mb=64, max_file_mb=4)
    assert res.reason == "file_size" and "File too large" in res.stderr


def test_ctypes_system_calls_gain_nothing(tmp_path):
    marker = tmp_path / "ctypes-marker"
    res = contained(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print('setuid', libc.setuid(0), os.getuid())
        print('unshare', libc.unshare(0x10000000 | 0x40000000))  # CLONE_NEWUSER | CLONE_NEWNET
        print('mount', libc.mount(b'none', b'/usr', b'tmpfs', 0, None))
        print('chroot', libc.chroot(b'/'))
        print('ptrace', libc.ptrace(16, {os.getpid()}, 0, 0))  # PTRACE_ATTACH to the host's test process
        print('system', libc.system(b'touch {marker}'))
        print('sethostname', libc.sethostname(b'x', 1))
        """)
    assert res.reason == "ok", res.stderr
    for call in ("setuid", "unshare", "mount", "chroot", "ptrace", "sethostname"):
        assert f"{call} -1" in res.stdout, res.stdout
    assert "setuid -1 65534" in res.stdout and not marker.exists()


def test_a_ctypes_segfault_is_reported_as_killed():
    res = contained("import ctypes\nctypes.string_at(0)\n")
    assert (res.reason, res.returncode) == ("killed", -signal.SIGSEGV)


def test_concurrent_runs_from_threads_are_each_contained():
    results = [None] * 4

    def one(i):
        results[i] = contained(f"import os\nprint({i}, os.getpid())\n")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.stdout.split()[0] for r in results] == ["0", "1", "2", "3"]
    assert all(r.reason == "ok" for r in results)


@pytest.mark.heavy
def test_the_bombs_at_generous_limits():
    """The fast tests' bombs at limits a real reward might use: 256 processes of 512 MB, a 512 MB scratch folder,
    a 10 s clock. Sibling of the fork-bomb, memory-bomb and disk tests above (small limits, same mechanisms)."""
    big = dict(timeout_s=10.0, memory_mb=512, max_procs=256, scratch_mb=512, max_file_mb=256)
    assert contained("import os\nwhile True:\n    os.fork()\n", **big).reason == "nproc"
    assert contained("chunks = []\nwhile True:\n    chunks.append(' ' * 10 ** 7)\n", **big).reason == "memory"
    assert contained("i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (64 << 20))\n    i += 1\n",
                     **big).reason == "disk"


def test_bad_arguments_and_a_missing_bwrap_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0, memory_mb=128)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("pass", timeout_s=1, memory_mb=1)
    with pytest.raises(ValueError, match="files key"):
        run_python("pass", timeout_s=1, memory_mb=128, files={"../escape": "x"})
    monkeypatch.setattr(sandbox.bwrap, "bwrap_path", lambda: None)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        run_python("pass", timeout_s=1, memory_mb=128)


def test_a_sandbox_that_cannot_set_up_is_a_sandbox_error(monkeypatch):
    monkeypatch.setattr(sandbox.bwrap, "python_path", lambda: "/usr/bin/no-such-python")
    with pytest.raises(SandboxError, match="did not start"):
        run_python("pass", timeout_s=2, memory_mb=128)


def test_the_host_check_finds_a_process_left_in_a_namespace():
    """The no-survivor check is not vacuous: it sees a live process in a pid namespace (this test's own)."""
    mine = os.readlink("/proc/self/ns/pid")
    assert os.getpid() in sandbox.in_namespace(mine)
    assert sandbox.in_namespace("pid:[0]") == []
