"""Whole runs under engine.backend=fsdp2 (heavy: each starts credo processes; tests/engines/test_engines.py holds
the fast in-process siblings):

- the tiny quickstart through the CLI gives deepspeed's metrics.jsonl bit for bit (every key but perf/*), the
  same final weights, and a Hugging Face folder that loads with those weights;
- a run SIGKILLed right after a checkpoint and resumed with run.resume=auto equals the uninterrupted run (rows
  and final weights), with a NaN-skipped step before the kill so the skip counters must carry over;
- two processes under torchrun update exactly as one (tests/invariants/test_data_parallel.py, on FSDP2).
"""

from __future__ import annotations

import sys

import pytest
import torch

from credo.distributed.engine import _free_port
from credo.export import checkpoint_state_dict
from tests.e2e.common import run_cli, tiny_overrides
from tests.invariants import dp_worker
from tests.reliability.common import (assert_same_run, comparable_rows, has_checkpoint, kill_recipe, run_and_kill,
                                      start, wait_ok)

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
FSDP2 = {"engine.backend": "fsdp2"}


def test_the_quickstart_under_fsdp2_equals_deepspeed_bit_for_bit(tmp_path):
    runs = {}
    for backend in ("deepspeed", "fsdp2"):
        out = tmp_path / backend
        p = run_cli(["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
            "run.steps": 4, "run.eval_every": 2, "run.save_every": 2, "engine.backend": backend})])
        assert p.returncode == 0, p.stderr[-3000:]
        runs[backend] = out
    a, b = comparable_rows(runs["deepspeed"]), comparable_rows(runs["fsdp2"])
    assert [r["step"] for r in a] == [0, 1, 2, 3, 4] and a == b
    assert any(r.get("train/grad_norm", 0) > 1.0 for r in a), "a clipped step (optim.grad_clip 1.0) must be compared"
    pa = checkpoint_state_dict(runs["deepspeed"] / "checkpoints" / "step_00000004")
    pb = checkpoint_state_dict(runs["fsdp2"] / "checkpoints" / "step_00000004")
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(runs["fsdp2"] / "final").state_dict()
    assert all(torch.equal(exported[k], pb[k]) for k in pb)


def test_sigkill_right_after_a_checkpoint_and_resume_under_fsdp2_is_exact(tmp_path):
    nan = {"CREDO_FAULT_NAN_STEP": "2"}
    whole = start(kill_recipe(tmp_path / "whole", **FSDP2), tmp_path / "whole.log", **nan)
    out = tmp_path / "killed"
    run_and_kill(kill_recipe(out, **FSDP2), has_checkpoint(out, 4), tmp_path / "killed.log", **nan)
    err = wait_ok(start(kill_recipe(out, **FSDP2, **{"run.resume": "auto"}), tmp_path / "resumed.log", **nan))
    assert "resumed from" in err and "step_0000000" in err
    wait_ok(whole)
    assert_same_run(tmp_path / "whole", out, 6)


def test_two_processes_under_fsdp2_update_exactly_as_one(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "tests.invariants.dp_worker"]
    proc = run_cli([str(tmp_path / "w2"), "fsdp2"], launcher=launcher, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / "w2" / "world2.pt")
    one = dp_worker.run(tmp_path / "w1", "fsdp2")
    dp_worker.assert_two_ranks_match_one(one, two)
