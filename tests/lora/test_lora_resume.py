"""A LoRA run (model.lora, with the KL reference = the adapter off) SIGKILLed between checkpoints and resumed with
run.resume=auto equals the uninterrupted run: every metrics.jsonl row but perf/*, exactly, and the final adapter
and base weights bit for bit (tests/reliability/test_resume.py does the same for full fine-tuning). A resume with
another adapter rank is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.common import REPO
from tests.reliability.common import assert_same_run, env, has_row, kill_recipe, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

LORA = {"model.lora.r": 4, "model.lora.alpha": 8.0, "model.ref_model": True, "algo.kl_coef": 0.05, "optim.lr": 1e-2}


def test_lora_run_killed_between_checkpoints_resumes_exactly(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    uninterrupted = start(kill_recipe(full, **LORA), tmp_path / "full.log")
    try:
        # checkpoints at steps 2 and 4; killed once step 3's row is logged, so step 3 runs again after the resume
        run_and_kill(kill_recipe(killed, **LORA), has_row(killed, 3), tmp_path / "killed.log", timeout=600)
        err = wait_ok(start(kill_recipe(killed, **{**LORA, "run.resume": "auto"}), tmp_path / "resumed.log"), timeout=600)
        assert "resumed from" in err and "step_00000002" in err
        wait_ok(uninterrupted, timeout=600)
    finally:
        if uninterrupted.poll() is None:  # its whole process group, as start() made it
            os.killpg(uninterrupted.pid, signal.SIGKILL)
            uninterrupted.wait()
    assert_same_run(full, killed, 6)
    # the adapter's rank shapes the checkpoint: a resume with another one is refused, naming the key
    args = kill_recipe(killed, **{**LORA, "run.resume": "auto", "run.steps": 8, "model.lora.r": 8})
    res = subprocess.run([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 2 and "model.lora.r: 4 -> 8" in res.stderr, res.stderr[-2000:]
