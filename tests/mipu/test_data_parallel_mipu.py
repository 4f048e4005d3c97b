"""MIPU step 2 in two processes (gloo on CPU): validation split across ranks, one decision for all, ranks
identical after accepted and rolled-back steps, and the mismatch metrics over both ranks' tokens."""

import json
import math
import sys

import pytest

from credo.distributed.engine import _free_port
from tests.e2e.common import read_rows, run_cli, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # two processes with rollbacks: about a minute


def test_two_process_mipu_keeps_ranks_identical(tmp_path):
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "credo.cli"]
    # c = 0: accept iff T_post >= 0, so some steps are rolled back and some kept
    args = ["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
        "run.steps": 4, "run.eval_every": 0, "run.save_every": 4, "mipu.enabled": True, "mipu.val_prompts": 4,
        "mipu.c_start": 0.0, "mipu.c_end": 0.0, "rollout.dtype": "bfloat16", "algo.policy_loss": "mipu"})]
    proc = run_cli(args, launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    accepted = [r["mipu/accepted"] for r in rows]
    assert set(accepted) <= {0.0, 1.0}
    assert rows[-1]["mipu/rollback_rate"] == pytest.approx(1 - sum(accepted) / 4)
    for r in rows:
        assert (r["mipu/t_post"] >= 0) == (r["mipu/accepted"] == 1.0)
        assert math.isfinite(r["mismatch/k3"]) and r["mismatch/k3"] > 0
