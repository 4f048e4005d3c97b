"""Tail batching and packed token-budget micro-batches with two data-parallel processes (gloo on CPU).

Each rank races its own 2 of the step's 4 prompts (3 launched, the loser queued), so both ranks queue a prompt a
step and run a long round at step 3; the token budget gives the ranks different numbers of micro-batches, which
they must even out (a rank that stepped its optimizer at another micro-batch would leave the replicas apart).
"""

import json
import sys

import pytest

from credo.distributed.engine import _free_port
from tests.e2e.common import read_rows, run_cli, tiny_overrides

pytestmark = pytest.mark.slow


def test_two_ranks_race_queue_and_stay_identical(tmp_path):
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "credo.cli"]
    args = ["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
        "run.steps": 4, "run.eval_every": 0, "run.save_every": 4, "rollout.tail_batching": "{}",
        "algo.packing": "true", "algo.micro_batch_tokens": 24})]
    proc = run_cli(args, launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "checkpoints" / "step_00000004" / "meta.json").read_text())
    digests = meta["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    ranks = meta["components"]["source"]["ranks"]  # every rank's draw position and queue, gathered
    assert [r["drawn"] for r in ranks] == [9, 9] and all(len(r["queue"]) == 1 for r in ranks)
    # queues hold each rank's own draw numbers; draw d of rank r is position 2d + r of the shared permutation
    assert all(0 <= d < 9 for r in ranks for d in r["queue"])
    rows = read_rows(out)  # steps 1-4 (no evaluation row)
    assert [r["rollout/long_round"] for r in rows] == [0.0, 0.0, 1.0, 0.0]  # rank 0's rounds
    assert all(r["perf/micro_batches"] >= 2 for r in rows) and rows[0]["train/grad_norm"] > 0
