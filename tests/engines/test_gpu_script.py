"""The GPU script's pieces run on CPU (`CREDO_GPU_TINY=1`), so they are not stale when a GPU comes:
benchmarks/gpu/update_mfu.py trains a tiny Qwen3 shape under both engines and writes its figures, and its FLOP
count is PaLM's formula (checked against a count written out by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from benchmarks.gpu.update_mfu import SHAPES, step_flops
from tests.e2e.common import REPO


def test_step_flops_is_6n_plus_the_attention_square():
    shape = SHAPES["0.6b"]  # 28 layers, 16 heads of 128
    n, tokens, seq = 596_049_920, 16384, 1024
    per_token = 6 * n + 2 * 3 * (2 * 28 * 16 * 128 * seq)  # QK^T and AV, 2 FLOPs a MAC, forward + 2x backward
    assert step_flops(shape, n, tokens, seq) == tokens * per_token


def run_tiny(out, engines: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    p = subprocess.run([sys.executable, "benchmarks/gpu/update_mfu.py", "--vocab-size", "256", "--tokens", "128",
                        "--engines", *engines, "--out", str(out)], cwd=REPO,
                       env={**env, "CREDO_GPU_TINY": "1", "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["engines"]) == set(engines)
    for r in res["engines"].values():
        assert r["tokens"] == 128 and len(r["step_s"]) == 2 and r["tokens_per_s"] > 0 and r["mfu"] is None
    return res


def test_update_mfu_runs_fsdp2_in_tiny_mode(tmp_path):
    run_tiny(tmp_path / "mfu.json", ["fsdp2"])  # no DeepSpeed start-up: seconds


@pytest.mark.heavy
def test_update_mfu_runs_both_engines_in_tiny_mode(tmp_path):
    res = run_tiny(tmp_path / "mfu.json", ["deepspeed", "fsdp2"])
    for r in res["engines"].values():
        assert r["tokens"] == 128 and len(r["step_s"]) == 2 and r["tokens_per_s"] > 0 and r["mfu"] is None
    assert res["engines"]["deepspeed"]["n_params"] == res["engines"]["fsdp2"]["n_params"]
