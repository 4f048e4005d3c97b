"""The judge recipes, sweeps and GPU configs load and pass `credo check` (no model is read)."""

import os
import subprocess
import sys

import pytest

from credo.ablate.spec import load_sweep
from credo.config import load_recipe
from tests.e2e.common import REPO


@pytest.mark.parametrize("name", ["judge_reward_qwen3_4b", "rm_nlhf_qwen3_4b", "ce_rm_qwen3_4b",
                                  "pgenrm_qwen3_8b"])
def test_gpu_configs_pass_credo_check(name):
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", f"recipes/gpu/{name}.yaml"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(REPO / "recipes" / "gpu" / f"{name}.yaml")
    assert r.rollout.backend == "vllm" and r.model.dtype == "bfloat16"
    if name == "judge_reward_qwen3_4b":
        assert (r.stages.reward, r.judge.path, r.judge.mode, r.rollout.group_size) == ("judge", "PKU-ONELab/CE-RM-4B",
                                                                                       "pointwise", 8)
    elif name == "ce_rm_qwen3_4b":
        assert r.stages.rollout_kwargs == {"n_criteria": 4, "evals_per_response": 2, "criteria_max_new_tokens": 4096,
                                           "eval_max_new_tokens": 8192}
        assert (r.rollout.group_size, r.algo.kl_coef, r.optim.lr) == (20, 1e-3, 2e-6)
    elif name == "pgenrm_qwen3_8b":
        from credo.tasks import make_task

        task = make_task(r.task)  # k = 50 prototypes need >= 50 member users; 3 few-shots as the released code
        assert (r.model.path, r.task.name, task.shots, task.num_users >= 50) == ("Qwen/Qwen3-8B", "pgenrm_users", 3,
                                                                               True)
        assert r.algo.kl_coef > 0 and r.model.ref_model
    else:
        assert r.stages.reward == "rm_nlhf" and r.model.path == "Qwen/Qwen3-4B"


@pytest.mark.parametrize("name", ["judge_reward", "rm_nlhf", "ce_rm"])
def test_sweeps_and_their_variants_load(name):
    s = load_sweep(REPO / "recipes" / "ablations" / f"{name}.yaml")
    assert len(s.seeds) == 5 and s.baseline in s.variants
    for overrides in s.variants.values():
        load_recipe(REPO / s.base, list(s.overrides) + list(overrides))
