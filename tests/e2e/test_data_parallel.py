"""Two processes, data-parallel through gloo on CPU: parameters stay identical across ranks."""

import json
import sys

import pytest

from credo.distributed.engine import _free_port
from tests.e2e.common import read_rows, run_cli, tiny_overrides

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("zero_stage", [1])
def test_two_process_step_keeps_ranks_identical(tmp_path, zero_stage):
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "credo.cli"]
    args = ["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
        "run.steps": 2, "run.eval_every": 2, "optim.zero_stage": zero_stage, "algo.advantage": "lite_ppo"})]
    proc = run_cli(args, launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "checkpoints" / "step_00000002" / "meta.json").read_text())
    digests = meta["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # rank 0 alone writes metrics
    assert rows[1]["train/grad_norm"] > 0  # the step really updated something
