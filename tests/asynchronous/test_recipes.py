"""The asynchronous recipes pass `credo check` (the paper-scale GPU one without a download) and say what they set."""

from __future__ import annotations

import os
import subprocess
import sys

from credo.config import load_recipe
from credo.train.build import check_run
from tests.e2e.common import REPO


def test_gpu_recipe_passes_credo_check():
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/gpu/async_topr_qwen2.5_7b.yaml"],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stdout  # TOPR against mu: no warning about the behaviour policy
    r = load_recipe(REPO / "recipes" / "gpu" / "async_topr_qwen2.5_7b.yaml")
    assert (r.rollout.max_staleness, r.rollout.async_mode, r.rollout.backend) == (1, "fixed_lag", "vllm")
    assert r.algo.policy_loss == "topr" and r.algo.loss_kwargs["behaviour_ratio"] is True


def test_cpu_recipes_pass_the_checks_of_credo_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    r = load_recipe(REPO / "recipes" / "async.yaml")
    assert check_run(r) == [] and (r.rollout.max_staleness, r.rollout.async_mode) == (1, "overlap")
    m = load_recipe(REPO / "recipes" / "async_multiturn.yaml")
    assert check_run(m) == [] and m.env.trajectory_async and m.env.kwargs["latency_s"] > 0
