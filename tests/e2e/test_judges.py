"""End to end on CPU with tiny models: a judge as the reward (warmed-up tiny judge), RM-NLHF and CE-RM runs."""

import math

import pytest

from credo.config import load_recipe
from credo.trainer import train
from tests.e2e.common import REPO, read_rows, tiny_overrides

TINY_JUDGE = {"judge.tiny.num_layers": 1, "judge.tiny.hidden_size": 64, "judge.tiny.num_heads": 2,
              "judge.tiny.num_kv_heads": 1, "judge.tiny.intermediate_size": 128}


@pytest.mark.slow
def test_judge_reward_run(tmp_path):
    o = tiny_overrides(tmp_path / "run", **{"run.steps": 2, "run.eval_every": 2, "reward.function": "null",
                                              "stages.reward": "judge", "judge.path": "tiny", **TINY_JUDGE,
                                              "judge.template": "'{question}{response}?'", "judge.max_new_tokens": 12,
                                              "judge.warmup_steps": 3, "judge.warmup_batch_size": 8})
    train(load_recipe(REPO / "recipes" / "judge_reward.yaml", o))
    rows = read_rows(tmp_path / "run")
    steps = [r for r in rows if "train/reward_mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0 <= r["reward/unparseable_frac"] <= 1 and r["reward/judge_calls"] == 16
        if r["reward/unparseable_frac"] < 1:
            assert 0 <= r["train/reward_mean"] <= 1
    assert "eval/accuracy" in rows[-1]


@pytest.mark.slow
def test_rm_nlhf_and_ce_rm_runs(tmp_path):
    o = tiny_overrides(tmp_path / "nlhf", **{"run.steps": 1, "run.eval_every": 0, "reward.function": "null",
                                               "rollout.max_new_tokens": 24, "stages.reward_kwargs.similarity": "rouge_l",
                                               "task.kwargs": "{mode: pairwise, critique: true, max_operand: 9, "
                                                              "fixed_width: true, human_critique_frac: 0.5}"})
    train(load_recipe(REPO / "recipes" / "rm_nlhf.yaml", o))
    row = read_rows(tmp_path / "nlhf")[-1]
    assert 0 <= row["reward/outcome_mean"] <= 1 and not math.isnan(row["reward/metarm_mse"])
    o = tiny_overrides(tmp_path / "cerm", **{"run.steps": 1, "run.eval_every": 0, "reward.function": "null",
                                               "rollout.prompts_per_step": 2, "rollout.group_size": 20,
                                               "rollout.max_new_tokens": 12,
                                               "task.kwargs": "{max_operand: 9, fixed_width: true}"})
    train(load_recipe(REPO / "recipes" / "ce_rm.yaml", o))
    row = read_rows(tmp_path / "cerm")[-1]
    assert 0 <= row["reward/criteria_accuracy"] <= 1 and 0 <= row["reward/unparseable_frac"] <= 1
