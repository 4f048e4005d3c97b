"""The mipu: section, rollout.dtype / fp8_weights and optim.lr_schedule: strict, range-checked, errors naming
the key; the MIPU recipes load and the GPU config passes `credo check`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from credo.config import ConfigError, load_recipe
from tests.e2e.common import REPO

QS = REPO / "recipes" / "quickstart.yaml"


def test_defaults_are_off():
    r = load_recipe(QS)
    assert (r.mipu.enabled, r.mipu.random_rollback, r.rollout.dtype, r.rollout.fp8_weights, r.optim.lr_schedule) == \
        (False, 0.0, None, False, "constant")


@pytest.mark.parametrize("overrides, message", [
    (["mipu.val_group_size=1"], "'mipu.val_group_size' = 1 is out of range"),
    (["mipu.val_prompts=0"], "'mipu.val_prompts' = 0 is out of range"),
    (["mipu.enabled=true", "task.train_size=8", "mipu.val_prompts=8"], "'mipu.val_prompts' = 8 is out of range"),
    (["mipu.random_rollback=1.5"], "'mipu.random_rollback' = 1.5 is out of range"),
    (["mipu.enabled=true", "mipu.random_rollback=0.5"], "'mipu.enabled' and 'mipu.random_rollback'"),
    (["mipu.enabled=true", "engine.zero_stage=3"], "'engine.zero_stage' = 3 is out of range"),
    (["mipu.random_rollback=0.3", "engine.zero_stage=3"], "'engine.zero_stage' = 3 is out of range"),
    (["mipu.c_start=.nan"], "'mipu.c_start'"),
    (["mipu.anneal_steps=-1"], "'mipu.anneal_steps' = -1 is out of range"),
    (["mipu.val_prompt=4"], "unknown config key 'mipu.val_prompt'"),
    (["rollout.dtype=float8"], "'rollout.dtype' = 'float8' is out of range"),
    (["rollout.fp8_weights=true", "engine.zero_stage=3"], "'engine.zero_stage' = 3 is out of range"),
    (["optim.lr_schedule=step"], "'optim.lr_schedule' = 'step' is out of range"),
    (["optim.min_lr_ratio=2"], "'optim.min_lr_ratio' = 2.0 is out of range"),
    (["algo.policy_loss=mipu", "algo.loss_kwargs={w_max: 0.5}"], "'algo.loss_kwargs.w_max' = 0.5 is out of range"),
])
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_recipe(QS, overrides)
    assert message in str(e.value)


def test_mipu_recipes_load():
    r = load_recipe(REPO / "recipes" / "mipu.yaml")
    assert r.mipu.enabled and r.algo.policy_loss == "mipu" and r.rollout.fp8_weights and r.rollout.dtype == "bfloat16"
    from credo import ablate

    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "mipu.yaml")
    assert set(sweep.variants) == {"grpo_dual_clip", "tis", "mis_token", "mis_sequence", "lr_decay", "step1_only",
                                   "step2_only", "random_rollback", "mipu"}
    assert len(sweep.seeds) == 5
    for name, over in sweep.variants.items():  # every variant is a valid recipe
        v = load_recipe(sweep.base, [*sweep.overrides, *over])
        assert v.rollout.fp8_weights and v.rollout.dtype == "bfloat16"
        assert v.mipu.enabled == (name in ("mipu", "step2_only"))
        assert (v.algo.policy_loss == "mipu") == (name in ("mipu", "step1_only", "random_rollback"))


def test_gpu_config_passes_credo_check():
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/gpu/mipu_qwen3_4b.yaml"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(REPO / "recipes" / "gpu" / "mipu_qwen3_4b.yaml")
    assert (r.model.path, r.optim.lr, r.rollout.prompts_per_step, r.rollout.group_size, r.algo.kl_coef) == \
        ("Qwen/Qwen3-4B", 1e-6, 64, 8, 0.001)
    assert r.rollout.backend == "vllm" and r.rollout.fp8_weights and r.algo.loss_kwargs["dual_clip"] == 3.0
    assert r.mipu.enabled and (r.mipu.c_start, r.mipu.c_end, r.mipu.anneal_steps) == (1e-3, 0.0, 100)
