"""Ctrl-C during training: finish the step in progress, checkpoint it, stop with a resume command.

Why the step in progress finishes rather than the run stopping at once: a checkpoint must hold a state a
finished step left. Mid-step (after the optimizer step, before the rollout engine's weight sync; or the
RNG or data position moved on), the state in memory is that of no step at all, and keeping a copy of the
last finished step's state to fall back on would double the memory of the weights and optimizer. So the
first Ctrl-C only sets a flag that the loop reads between steps; the second stops at once (the newest
checkpoint already on disk stays the resume point).

With `rollout.backend=vllm`, a Ctrl-C typed in a terminal reaches vLLM's engine processes too, and they shut
down: a step interrupted while generating cannot finish, and the run stops with the newest checkpoint on disk.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("credo")


class RunInterrupted(Exception):
    """The run stopped on Ctrl-C (SIGINT).

    Attributes:
        step: the last step that finished (0: none).
        checkpoint: the step of the newest checkpoint on disk, None when there is none.
        run_dir: the run's folder.
    """

    def __init__(self, step: int, checkpoint: int | None, run_dir):
        self.step, self.checkpoint, self.run_dir = step, checkpoint, run_dir
        where = f"checkpoint at step {checkpoint}" if checkpoint is not None else "no checkpoint"
        super().__init__(f"interrupted after step {step} ({where}) in {run_dir}")


class DeferredInterrupt:
    """Context manager: the first SIGINT sets `requested`, the second raises KeyboardInterrupt.

    Installed only in the main thread (Python delivers signals there); elsewhere it does nothing.
    """

    def __init__(self, announce: bool = True):
        self.requested = False
        self.announce = announce
        self._previous = None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            log.warning("Ctrl-C: stopping after the step in progress, then writing a checkpoint "
                        "(Ctrl-C again to stop now, keeping the newest checkpoint on disk)")

    def __enter__(self) -> "DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
