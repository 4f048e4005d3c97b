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
    assert (r.stages.schedule, r.stages.schedule_kwargs, r.rollout.backend) == ("fixed_lag", {"max_staleness": 1}, "vllm")
    assert r.algo.policy_loss == "topr" and r.algo.loss_kwargs["behaviour_ratio"] is True


def test_cpu_recipes_pass_the_checks_of_credo_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    r = load_recipe(REPO / "recipes" / "async.yaml")
    plan = check_run(r)
    assert plan.notes == () and (plan.schedule.name, plan.staleness) == ("overlap", 1)
    m = load_recipe(REPO / "recipes" / "async_multiturn.yaml")
    plan = check_run(m)
    assert plan.notes == () and (plan.schedule.name, plan.staleness) == ("fixed_lag", 1)
    assert m.env.trajectory_async and m.env.kwargs["latency_s"] > 0


def test_accuracy_sweep_runs_every_off_policy_loss_at_both_lags_against_sync():
    """recipes/ablations/async_accuracy.yaml: the synchronous baseline, then decoupled PPO, TIS, TOPR and CISPO at
    S = 1 and 2 in fixed_lag, each reading the behaviour policy (no warning from credo check), the most informative
    arms first (within a seed, credo ablate runs the variants in this order)."""
    from credo import ablate
    from credo.preflight import reads_behaviour_policy

    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "async_accuracy.yaml")
    assert len(sweep.seeds) >= 5 and sweep.baseline == "sync"
    assert list(sweep.variants)[:3] == ["sync", "s1_dppo", "s2_dppo"]
    sweep.seeds = sweep.seeds[:1]
    arms = {}
    for run in ablate.plan_runs(sweep, threads=1):
        r = run.recipe
        arms[run.variant] = (r.rollout.max_staleness, r.algo.policy_loss, r.algo.loss_kwargs)
        assert r.rollout.async_mode == "fixed_lag" and r.rollout.backend == "hf", run.variant
        assert reads_behaviour_policy(r.algo.policy_loss, r.algo.loss_kwargs) == (r.rollout.max_staleness > 0), \
            run.variant
    assert arms["sync"] == (0, "ppo", {})
    for s in (1, 2):
        assert arms[f"s{s}_dppo"] == (s, "ppo", {"correction": "tis", "correction_cap": 2.0})
        assert arms[f"s{s}_tis"] == (s, "reinforce", {"correction": "tis", "correction_cap": 2.0})
        assert arms[f"s{s}_topr"] == (s, "topr", {"behaviour_ratio": True})
        assert arms[f"s{s}_cispo"] == (s, "cispo", {"behaviour_ratio": True})
    assert len(arms) == 9
