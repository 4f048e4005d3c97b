"""The attention-credit recipes: the thin CPU recipe, the 7-variant sweep, and the paper-scale GPU configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from credo import ablate
from credo.config import load_recipe

REPO = Path(__file__).resolve().parents[2]


def test_sweep_has_the_seven_strategies_five_seeds_and_forty_steps():
    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "attention_credit.yaml")
    runs = ablate.plan_runs(sweep, threads=1)
    assert sweep.baseline == "grpo" and sorted(sweep.seeds) == [0, 1, 2, 3, 4]
    strategies = {}
    for run in runs:
        assert run.recipe.run.steps == 40
        probes = run.recipe.stages.probes
        strategy = run.recipe.stages.probe_kwargs["attention_credit"]["strategy"] if probes else None
        strategies.setdefault(strategy, set()).add(run.recipe.run.seed)
    assert set(strategies) == {None, "random", "entropy", "local", "global", "coupled", "flow"}
    assert all(seeds == {0, 1, 2, 3, 4} for seeds in strategies.values())


def test_thin_recipe_is_the_quickstart_plus_the_probe():
    quick, credit = load_recipe(REPO / "recipes" / "quickstart.yaml"), load_recipe(REPO / "recipes" / "attention_credit.yaml")
    for section in ("model", "task", "sft", "rollout", "algo", "optim"):
        assert getattr(quick, section) == getattr(credit, section), section
    assert credit.stages.probes == ["attention_credit"]
    assert credit.stages.probe_kwargs["attention_credit"]["strategy"] == "coupled"


@pytest.mark.parametrize("name,strategy,tokens", [("attention_coupled_qwen3_4b", "coupled", 1024),
                                                  ("attention_flow_qwen3_4b", "flow", 8192)])
def test_gpu_configs_pass_credo_check(name, strategy, tokens):
    path = REPO / "recipes" / "gpu" / f"{name}.yaml"
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(path)
    assert r.model.path == "Qwen/Qwen3-4B-Base" and r.rollout.max_new_tokens == tokens
    # the papers' recipe: batch 512, 16 gradient steps, lr 1e-6, no KL, no entropy loss
    assert r.rollout.prompts_per_step * r.rollout.group_size == 512 and r.algo.mini_batches == 16
    assert (r.optim.lr, r.algo.kl_coef, r.algo.entropy_coef, r.algo.advantage) == (1e-6, 0.0, 0.0, "grpo")
    kwargs = r.stages.probe_kwargs["attention_credit"]
    assert (kwargs["strategy"], kwargs["q"], kwargs["gamma_amp"]) == (strategy, 0.4, 1.5)
