"""Kill tests: a run SIGKILLed mid-way and resumed with run.resume=auto equals an uninterrupted run.

Each test runs the same 6-step recipe (checkpoint every 2 steps, eval every 3, fp32 on CPU) as the
uninterrupted run, kills it from outside with SIGKILL (the whole process group, as a node failure would),
resumes it and compares: every metrics.jsonl row except the wall-clock `perf/*` keys, exactly, and the
final parameters (DeepSpeed's model states of the last checkpoint) bit for bit.

The kill points are drawn from a seeded RNG: one right after a checkpoint appears (step 2 or 4), one
after a step's row is logged between checkpoints (step 3 or 5). The hf runs also skip step 2 for a NaN
loss, so the resumed run must carry the skip counters on. The second kill also leaves a torn checkpoint
newer than the last good one: resume must report it, set it aside and use the previous one.
"""

from __future__ import annotations

import os
import random
import shutil
import signal

import pytest

from credo.checkpoint import list_checkpoints
from tests.reliability.common import (assert_same_run, has_checkpoint, has_row, kill_recipe, run_and_kill, start,
                                      wait_ok)

pytestmark = pytest.mark.slow

_rng = random.Random(20261129)
AFTER_CHECKPOINT = _rng.choice([2, 4])
BETWEEN_CHECKPOINTS = _rng.choice([3, 5])
VLLM_KILL = _rng.choice([3, 4, 5])
STEPS = 6
NAN = {"CREDO_FAULT_NAN_STEP": "2"}


class Background:
    """An uninterrupted run started once per module and awaited by the first test that needs it."""

    def __init__(self, out, log, **env_extra):
        self.out = out
        self.proc = start(kill_recipe(out, **env_extra.pop("overrides", {})), log, **env_extra)
        self.done = False

    def result(self):
        if not self.done:
            wait_ok(self.proc)
            self.done = True
        return self.out

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def uninterrupted_hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted_hf")
    bg = Background(root / "run", root / "stderr.log", **NAN)
    yield bg
    bg.stop()


def newest(run_dir):
    return list_checkpoints(run_dir / "checkpoints")[-1]


def test_kill_right_after_a_checkpoint(tmp_path, uninterrupted_hf):
    out = tmp_path / "run"
    run_and_kill(kill_recipe(out), has_checkpoint(out, AFTER_CHECKPOINT), tmp_path / "killed.log", **NAN)
    resume_from = newest(out)
    assert resume_from.name >= f"step_{AFTER_CHECKPOINT:08d}"
    err = wait_ok(start(kill_recipe(out, **{"run.resume": "auto"}), tmp_path / "resumed.log", **NAN))
    assert f"resumed from {resume_from}" in err
    assert_same_run(uninterrupted_hf.result(), out, STEPS)


def test_kill_between_checkpoints_with_a_torn_newest(tmp_path, uninterrupted_hf):
    out = tmp_path / "run"
    run_and_kill(kill_recipe(out), has_row(out, BETWEEN_CHECKPOINTS), tmp_path / "killed.log", **NAN)
    good = newest(out)
    # a checkpoint newer than the last good one, cut short (as a failing disk or an interrupted copy leaves it)
    torn = good.with_name(f"step_{int(good.name[5:]) + 1:08d}")
    shutil.copytree(good, torn)
    states = torn / "state" / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[:1000])
    err = wait_ok(start(kill_recipe(out, **{"run.resume": "auto"}), tmp_path / "resumed.log", **NAN))
    assert f"skipping checkpoint {torn}: state/mp_rank_00_model_states.pt has size 1000" in err
    assert f"resumed from {good}" in err
    assert (out / "checkpoints" / f"corrupt-{torn.name}").is_dir()
    assert_same_run(uninterrupted_hf.result(), out, STEPS)


@pytest.mark.vllm
@pytest.mark.heavy  # two vLLM engine runs and a SIGKILL: minutes; the hf resume tests above keep the property in CI
def test_kill_and_resume_with_vllm_rollouts(tmp_path):
    """vLLM samples each request from its own seed (derived from the step and prompt), and the engine gets
    the checkpoint's weights on resume, so the resumed rollouts are the uninterrupted ones."""
    pytest.importorskip("vllm")
    vllm = {"rollout.backend": "vllm"}
    base = Background(tmp_path / "uninterrupted", tmp_path / "uninterrupted.log", overrides=vllm)
    try:  # the uninterrupted run and the one to kill start together: engine start-up dominates
        out = tmp_path / "run"
        run_and_kill(kill_recipe(out, **vllm), has_row(out, VLLM_KILL), tmp_path / "killed.log")
        resume_from = newest(out)
        err = wait_ok(start(kill_recipe(out, **vllm, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
        assert f"resumed from {resume_from}" in err
        assert_same_run(base.result(), out, STEPS)
    finally:
        base.stop()
