"""Ctrl-C handling (credo.train.interrupt): the exception's message and fields, and the deferred SIGINT handler
called directly (no real signal is sent)."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from credo.train.interrupt import DeferredInterrupt, RunInterrupted


def test_run_interrupted_names_the_step_the_checkpoint_and_the_folder():
    e = RunInterrupted(4, 3, "runs/x")
    assert (e.step, e.checkpoint, e.run_dir) == (4, 3, "runs/x")
    assert str(e) == "interrupted after step 4 (checkpoint at step 3) in runs/x"
    assert str(RunInterrupted(0, None, "/r")) == "interrupted after step 0 (no checkpoint) in /r"
    assert str(RunInterrupted(2, 0, "/r")) == "interrupted after step 2 (checkpoint at step 0) in /r"
    assert isinstance(e, Exception)


def test_first_press_sets_the_flag_and_says_so_the_second_raises(caplog):
    stop = DeferredInterrupt()
    assert stop.requested is False and stop.announce is True
    with caplog.at_level(logging.WARNING, logger="credo"):
        stop._handler(signal.SIGINT, None)
    assert stop.requested is True
    msg, = [r.getMessage() for r in caplog.records if r.name == "credo"]
    assert msg == ("Ctrl-C: stopping after the step in progress, then writing a checkpoint (Ctrl-C again to stop now, "
                   "keeping the newest checkpoint on disk)")
    with pytest.raises(KeyboardInterrupt):
        stop._handler(signal.SIGINT, None)


def test_announce_false_is_silent(caplog):
    stop = DeferredInterrupt(announce=False)
    with caplog.at_level(logging.DEBUG, logger="credo"):
        stop._handler(signal.SIGINT, None)
    assert stop.requested and not [r for r in caplog.records if r.name == "credo"]


def test_the_handler_is_installed_in_the_main_thread_and_put_back_on_exit():
    def before(signum, frame):
        pass

    outer = signal.signal(signal.SIGINT, before)
    try:
        stop = DeferredInterrupt(announce=False)
        with stop as entered:
            assert entered is stop
            assert signal.getsignal(signal.SIGINT) == stop._handler
            assert stop._previous is before
        assert signal.getsignal(signal.SIGINT) is before and stop._previous is None
        stop.__exit__(None, None, None)  # a second exit changes nothing
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, outer)


def test_outside_the_main_thread_it_does_nothing():
    outer = signal.getsignal(signal.SIGINT)
    seen = {}

    def run():
        with DeferredInterrupt() as stop:
            seen["previous"] = stop._previous
            seen["handler"] = signal.getsignal(signal.SIGINT)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == {"previous": None, "handler": outer}
    assert signal.getsignal(signal.SIGINT) is outer
