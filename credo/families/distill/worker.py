"""distill.placement: worker: the teacher in its own process on this host (not the trainer's).

    teacher = TeacherProcess(folder, dtype="float32", rows=256, chunk_size=1024, device="cpu", threads=1)
    log_probs = teacher(input_ids, attention_mask, mask)     # as `TeacherScorer` returns them
    teacher.close()

The process is spawned (as the overlap schedule's rollout workers are: credo.distributed.rollout_workers), loads the
teacher's folder in `dtype` on `device` (the trainer's: the same GPU, or the CPU) with the trainer's thread count,
and holds a `TeacherScorer` with the trainer's row chunks: its log-probs are bitwise the trainer placement's. The
two talk over a pipe, one call at a time: the batch's tensors go as numpy arrays and the log-probs come back so.

The process is gone when the run is: `close()` (the trainer closes the advantage stage at the end of `fit` and in
`Trainer.close`) asks it to stop and kills it after GRACE_S; it is a daemon (killed when the trainer exits); and it
exits by itself within a second once its trainer is gone (a SIGKILL leaves a daemon behind otherwise). Every wait has a
timeout and checks that the process lives: one that dies or stops answering is a `TeacherWorkerError` naming its pid
and exit code (the teacher is not restarted here; the Ray placement restarts its actors).
"""

from __future__ import annotations

import os
import time
import traceback
import weakref

import torch

from credo.errors import TrainingError

STARTUP_TIMEOUT_S = 600.0
"""Longest wait for the process to import torch and load the teacher."""
CALL_TIMEOUT_S = 600.0
"""Longest wait for one batch's log-probs."""
GRACE_S = 10.0
"""How long `close()` waits for the process to stop before it kills it."""


class TeacherWorkerError(TrainingError):
    """The teacher's process died, failed or stopped answering; the message names it."""


class TeacherProcess:
    """The teacher's log-probs from its own process (see the module docstring); the `TeacherScorer` call."""

    def __init__(self, folder: str, *, dtype: str, rows: int, chunk_size: int, device: str | torch.device,
                 threads: int, startup_timeout_s: float = STARTUP_TIMEOUT_S, call_timeout_s: float = CALL_TIMEOUT_S):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fork would copy the trainer's threads, CUDA context and process group
        self.call_timeout_s = call_timeout_s
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=teacher_main, name="credo-teacher", daemon=True,
                                args=(child, str(folder), dtype, max(1, rows), chunk_size, str(device), threads,
                                      os.getpid()))
        self.proc.start()
        child.close()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.conn)
        try:
            self.info = self._answer(startup_timeout_s, "loading the teacher")
        except BaseException:
            self.close()
            raise

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """As `TeacherScorer.__call__`: [B, L-1] float32 on the device of `mask`, 0 off the mask."""
        if not self._finalizer.alive:
            raise TeacherWorkerError("the teacher's process was closed")
        try:
            self.conn.send(tuple(t.detach().cpu().numpy() for t in (input_ids, attention_mask, mask)))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._check_alive("a batch")
            raise
        out = self._answer(self.call_timeout_s, "scoring a batch")
        return torch.from_numpy(out).to(mask.device)

    def _answer(self, timeout_s: float, doing: str):
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.2):
            self._check_alive(doing)
            if time.monotonic() >= deadline:
                raise TeacherWorkerError(f"the teacher's process (pid {self.proc.pid}) did not answer within "
                                         f"{timeout_s:g} s {doing} (distill.placement: worker)")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, ConnectionResetError):
            self.proc.join(timeout=5)
            self._check_alive(doing)
            raise
        if kind == "error":
            raise TeacherWorkerError(f"the teacher's process (pid {self.proc.pid}) failed {doing}:\n{payload}")
        return payload

    def _check_alive(self, doing: str) -> None:
        if not self.proc.is_alive():
            raise TeacherWorkerError(f"the teacher's process (pid {self.proc.pid}) died with exit code "
                                     f"{self.proc.exitcode} {doing} (distill.placement: worker); the run stops")

    def close(self) -> None:
        """Stop the process (safe to call twice)."""
        self._finalizer()


def _stop(proc, conn) -> None:
    if proc.is_alive():
        try:
            conn.send(None)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            pass
        proc.join(timeout=GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    conn.close()


def teacher_main(conn, folder: str, dtype: str, rows: int, chunk_size: int, device: str, threads: int,
                 parent: int) -> None:
    """The process's loop: load the teacher, answer 'ready', then score each batch sent; until told to stop, or
    until its trainer is gone."""
    try:
        from credo.families.distill.teacher import TeacherScorer
        from credo.models import check_vocab, load_causal_lm, load_tokenizer

        torch.set_num_threads(threads)
        dev = torch.device(device)
        model = load_causal_lm(folder, dtype)
        check_vocab(model, load_tokenizer(folder), folder)
        model = model.to(dev).eval().requires_grad_(False)
        scorer = TeacherScorer(model, rows=rows, chunk_size=chunk_size, device=dev)
        conn.send(("ok", {"pid": os.getpid(), "device": str(dev), "threads": torch.get_num_threads()}))
        while True:
            if not conn.poll(1.0):
                if os.getppid() != parent:  # the trainer died
                    return
                continue
            msg = conn.recv()
            if msg is None:  # told to stop: at once (an interpreter's teardown under torch can take seconds)
                conn.close()
                os._exit(0)
            ids, att, mask = (torch.from_numpy(a) for a in msg)
            conn.send(("ok", scorer(ids, att, mask).cpu().numpy()))
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the trainer closed its end: nothing to report to
        return
    except BaseException:  # noqa: BLE001 - reported to the trainer, which names this process
        try:
            conn.send(("error", traceback.format_exc()[-3000:]))
        finally:
            raise SystemExit(1)
