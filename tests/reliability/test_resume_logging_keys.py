"""A resume accepts a change of what is only logged (progress bar, curves, wandb, TensorBoard, rollout dumps,
how often to evaluate) without run.allow_config_change, and such a change leaves training bit-identical."""

from __future__ import annotations

import pytest
import torch

from credo.config import Recipe, recipe_to_dict
from credo.train.state import config_changes

LOGGING_ONLY = {"run.progress": False, "run.plot": False, "run.wandb": True, "run.wandb_mode": "online",
                "run.wandb_project": "other", "run.dump_rollouts_every": 1, "run.verbose": True, "run.eval_every": 3}
TRAINING = {"run.seed": 7, "run.eval_temperature": 0.7, "run.eval_samples": 4, "optim.lr": 0.5, "run.save_every": 5}


def _changed(key: str, value) -> dict:
    new = recipe_to_dict(Recipe())
    section, name = key.split(".")
    new[section][name] = value
    return config_changes(recipe_to_dict(Recipe()), new)


@pytest.mark.parametrize("key", sorted(LOGGING_ONLY))
def test_logging_only_keys_are_no_change(key):
    assert _changed(key, LOGGING_ONLY[key]) == {}


@pytest.mark.parametrize("key", sorted(TRAINING))
def test_other_keys_still_count(key):
    assert list(_changed(key, TRAINING[key])) == [key]


@pytest.mark.slow
def test_resume_with_new_logging_keys_is_accepted_and_trains_the_same(tmp_path):
    """2 steps, then a resume to 4 that dumps rollouts, evaluates every 3 steps (at step 3, before step 4 trains)
    and draws no curves, against 4 steps in one go without any of that: the same parameters and losses, bit for
    bit."""
    from credo.config import load_recipe
    from credo.trainer import Trainer
    from tests.e2e.common import read_rows, tiny_overrides

    def run(out, **extra):
        trainer = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(out, **{
            "run.eval_every": 0, "run.save_every": 2, **extra})))
        try:
            trainer.fit()
            return {k: v.detach().clone() for k, v in trainer.engine.module.state_dict().items()}
        finally:
            trainer.close()

    straight = run(tmp_path / "straight", **{"run.steps": 4})
    run(tmp_path / "resumed", **{"run.steps": 2})
    resumed = run(tmp_path / "resumed", **{"run.steps": 4, "run.resume": "auto", "run.dump_rollouts_every": 1,
                                           "run.eval_every": 3, "run.plot": False})
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    rows = read_rows(tmp_path / "resumed")
    assert [r["train/loss"] for r in rows] == [r["train/loss"] for r in read_rows(tmp_path / "straight")]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [3, 4]  # the new setting took effect
    assert sorted(p.name for p in (tmp_path / "resumed" / "rollouts").iterdir()) == ["step_3.jsonl", "step_4.jsonl"]
