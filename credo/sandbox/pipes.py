"""The host side of a sandboxed run's pipes: stdin fed by a thread, stdout/stderr read under a byte cap and a
deadline, and the launcher's ready pipe (the sandbox's pid namespace, which the host checks is empty at the end)."""

from __future__ import annotations

import os
import selectors
import subprocess
import threading
import time

_CHUNK = 1 << 16


class Pipes:
    """stdout, stderr and the ready pipe of `proc`, read together until it exits or a limit is crossed."""

    def __init__(self, proc: subprocess.Popen, ready_fd: int, stdin: str | bytes | None, max_output_bytes: int):
        self.proc, self.ready_fd, self.max_output_bytes = proc, ready_fd, max_output_bytes
        self.out, self.err, self._ready = bytearray(), bytearray(), bytearray()
        self.namespace: str | None = None
        data = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin or b"")
        self._feeder = threading.Thread(target=self._feed, args=(data,), daemon=True, name="credo-sandbox-stdin")
        self._feeder.start()

    def _feed(self, data: bytes) -> None:
        """Write stdin in a thread, so a program that prints before it reads cannot deadlock the host."""
        try:
            if data:
                self.proc.stdin.write(data)
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

    def pump(self, timeout_s: float, startup_s: float) -> str:
        """Read until every stream is closed and the process has exited: 'exit'; 'startup' when the launcher has not
        reported within `startup_s`; 'timeout' `timeout_s` after it reported (the program's clock starts when the
        program starts, so a loaded host's slow set-up is not charged to it); 'output_limit' once stdout and stderr
        together pass max_output_bytes."""
        sel = selectors.DefaultSelector()
        for f, buf in ((self.proc.stdout.fileno(), self.out), (self.proc.stderr.fileno(), self.err),
                       (self.ready_fd, self._ready)):
            sel.register(f, selectors.EVENT_READ, buf)
        deadline, late = time.monotonic() + startup_s, "startup"
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return late
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        sel.unregister(key.fd)
                        if key.fd == self.ready_fd:
                            self.namespace = self._ready.decode("ascii", "replace") or None
                            if self.namespace:
                                deadline, late = time.monotonic() + timeout_s, "timeout"
                        continue
                    key.data.extend(chunk)
                    if key.fd != self.ready_fd and len(self.out) + len(self.err) > self.max_output_bytes:
                        return "output_limit"
        finally:
            sel.close()
        if late == "startup":  # the sandbox exited before its launcher reported: a set-up failure
            self.proc.wait()
            return "exit"
        try:  # the streams are closed, but a process that closed them may still run
            self.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            return "timeout"
        return "exit"

    def close(self) -> tuple[str, str]:
        """stdout and stderr as text, cut at max_output_bytes together; the pipes closed, the stdin thread joined."""
        if self.namespace is None and self._ready:
            self.namespace = self._ready.decode("ascii", "replace")
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()
        self._feeder.join(timeout=5)
        cap = self.max_output_bytes
        out = bytes(self.out[:cap])
        err = bytes(self.err[:max(cap - len(out), 0)])
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
