"""A short end-to-end run with the hf backend: metrics written, parameters changed, run dir complete."""

import pytest
import torch

from credo.config import load_recipe
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = pytest.mark.slow


def test_short_run_hf_writes_metrics_and_updates_params(tmp_path):
    from credo.trainer import Trainer

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"run.save_every": 3}))
    trainer = Trainer(r)
    before = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
    run_dir = trainer.fit()
    trainer.close()
    after = dict(trainer.engine.module.named_parameters())
    changed = [k for k in before if not torch.equal(before[k], after[k].detach())]
    assert len(changed) == len(before), f"unchanged parameters: {set(before) - set(changed)}"

    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for key in ("train/reward_mean", "train/loss", "train/entropy", "perf/step_time_s", "perf/tokens_per_s",
                "perf/rollout_s", "perf/train_s", "perf/reward_s", "perf/logprob_s", "perf/update_s", "perf/sync_s"):
        assert all(key in row for row in rows[1:]), key
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    assert "train/kl" not in rows[1]  # no reference model in this recipe
    assert (run_dir / "config.yaml").read_text().count("policy_loss: ppo") == 1
    assert (run_dir / "curves.png").stat().st_size > 0
    assert (run_dir / "checkpoints" / "step_00000003" / "meta.json").exists()


def test_reference_model_logs_kl(tmp_path):
    from credo.trainer import train

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "model.ref_model": True, "algo.kl_coef": 0.05, "run.steps": 2, "run.eval_every": 0,
        "algo.policy_loss": "cispo", "algo.advantage": "rloo"}))
    rows = read_rows(train(r))
    assert all("train/kl" in row for row in rows)
    assert rows[0]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert rows[1]["train/kl"] > 0


def test_multi_epoch_uses_pre_update_old_log_probs(tmp_path):
    """With 2 epochs x 2 mini-batches, later passes see ratios != 1 against the recomputed pi_old."""
    from credo.trainer import train

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "run.steps": 1, "run.eval_every": 0, "algo.ppo_epochs": 2, "algo.mini_batches": 2, "optim.lr": 1e-2}))
    row = read_rows(train(r))[0]
    assert row["loss/ratio_max"] > 1.0 + 1e-4 or row["loss/ratio_min"] < 1.0 - 1e-4
