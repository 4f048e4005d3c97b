"""Data-parallel = single process: on the same global batch, 2 processes and 1 process give the same
grad norm, loss and parameters after one step, for every agg_mode.

The world of 1 runs in this process; the world of 2 is one torchrun launch of `dp_worker`, which loops
over the agg modes itself (a launch costs seconds; a step of the tiny model, milliseconds). The entropy
bonus, the KL term, per-token weights, off-policy ratios and a failed reward call are all on, and the
gradient is clipped: a wrong data-parallel loss scale shows in the grad norm, the loss, and (through the
clip) the parameters.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from credo.distributed.engine import _free_port
from tests.e2e.common import run_cli
from tests.invariants import dp_worker

pytestmark = [pytest.mark.slow, pytest.mark.invariants]


def test_two_processes_update_exactly_as_one(tmp_path):
    if os.environ.get("MUTANT_UNDER_TEST"):
        # mutmut traces only this process, and a torchrun launch per mutant costs a minute on 2 cores;
        # the data-parallel mutants (the backward scale, the all-reduced counts) were checked by hand
        pytest.skip("not run under mutation testing")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "tests.invariants.dp_worker"]
    proc = run_cli([str(tmp_path / "w2")], launcher=launcher, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / "w2" / "world2.pt")
    one = dp_worker.run(tmp_path / "w1")
    dp_worker.assert_two_ranks_match_one(one, two)
