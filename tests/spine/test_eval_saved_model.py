"""`credo eval MODEL RECIPE_OR_TASK` and `credo.evaluate` on real runs started with `credo.train`: the eval of a
run's final/, of its run folder and of its last checkpoint equals the run's last logged eval metric (same seeds),
for a task scored by reward functions (eval/reward_mean, sampled at temperature 1) and for the multi-turn
family's evaluator (eval/return); --samples / --temperature override the recipe's run.eval_*."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import credo
from tests.byo.common import make_model_dir
from tests.byo.test_run_own_model import byo_overrides
from tests.e2e.common import read_rows, run_cli

pytestmark = pytest.mark.slow


def as_dict(overrides: list[str]) -> dict:
    return dict(o.split("=", 1) for o in overrides)


def test_eval_of_final_checkpoint_and_run_folder_equals_the_runs_last_eval(tmp_path):
    model_dir = make_model_dir(tmp_path / "my-model")
    overrides = byo_overrides(tmp_path, model_dir, **{"run.name": "eval", "run.eval_temperature": 1.0,
                                                      "run.eval_samples": 2, "run.steps": 2, "run.eval_every": 2,
                                                      "run.save_every": 2})
    # the recipe as an OmegaConf config with key=value overrides: credo.train returns the run folder
    run_dir = credo.train(OmegaConf.create({"run": {"name": "eval"}}), overrides)
    assert run_dir == tmp_path / "run" and (run_dir / "final" / "config.json").is_file()
    logged = read_rows(run_dir)[-1]["eval/reward_mean"]
    recipe_args = [o for o in overrides if not o.startswith(("run.output_dir", "model.path"))]

    res = run_cli(["eval", str(run_dir / "final"), "recipes/quickstart.yaml", *recipe_args, "sft.enabled=false",
                   "--out", str(tmp_path / "eval.json")], timeout=600)
    assert res.returncode == 0, res.stderr
    header, result_line = res.stdout.splitlines()[:2]  # `credo eval` prints its header, then its result (3aa67e5)
    assert header.startswith("credo eval: ") and result_line == f"eval/reward_mean = {logged:.6g}"
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["metrics"] == {"eval/reward_mean": logged}
    assert (result["eval_samples"], result["eval_temperature"]) == (2, 1.0) and len(result["samples"]) == 16

    ckpt = run_dir / "checkpoints" / "step_00000002"
    for model in (ckpt, run_dir):  # a checkpoint (exported on the way) and a run folder (its final/)
        assert credo.evaluate(model, "recipes/quickstart.yaml", recipe_args)["metrics"] == {"eval/reward_mean": logged}

    greedy = credo.evaluate(run_dir / "final", "recipes/quickstart.yaml", recipe_args, samples=1, temperature=0.0)
    assert (greedy["eval_samples"], greedy["eval_temperature"]) == (1, 0.0) and len(greedy["samples"]) == 8
    by_task = credo.evaluate(run_dir / "final", "arithmetic", {"task.eval_size": 5})
    assert set(by_task["metrics"]) == {"eval/accuracy"} and len(by_task["samples"]) == 5


def test_eval_uses_the_active_familys_evaluator(tmp_path):
    overrides = {"run.output_dir": str(tmp_path / "run"), "run.steps": 1, "run.eval_every": 1, "run.progress": False,
                 "run.plot": False, "run.threads": 1, "sft.steps": 60, "env.eval_episodes": 16,
                 "rollout.prompts_per_step": 4}  # 60 warm-up steps: returns that vary from game to game
    run_dir = credo.train("recipes/multiturn.yaml", overrides)
    rows = read_rows(run_dir)
    logged = rows[-1]["eval/return"]
    assert logged != rows[0]["eval/return"]  # the metric moves with the policy (one step apart)
    res = credo.evaluate(run_dir / "final", "recipes/multiturn.yaml", {"env.eval_episodes": 16, "run.threads": 1})
    assert res["metrics"] == {"eval/return": logged}
    assert res["eval_temperature"] == 1.0
