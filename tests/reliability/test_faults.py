"""Fault injection in short real runs: failing and hanging reward calls, NaN losses.

The runs are in-process (a Trainer in this process, so a test can count what the reward function did and
look at the loss mask), except the one that must stop the CLI with an error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from credo.config import load_recipe
from tests.e2e.common import read_rows, tiny_overrides
from tests.reliability.common import final_params, run_cli_expecting_error

pytestmark = pytest.mark.slow

PROMPTS = 4  # prompts per step in tiny_overrides: one reward call per prompt (group) unless it raises


def run_in_process(out_dir: Path, *, dumps: bool = False, **extra):
    """Train the tiny recipe here; with `dumps`, also return each step's rollout dump rows (what it trained on)."""
    from credo.trainer import Trainer

    if dumps:
        extra["run.dump_rollouts_every"] = 1
    trainer = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(out_dir, **extra)))
    try:
        run_dir = trainer.fit()
    finally:
        trainer.close()
    rows = [row for row in read_rows(run_dir) if row["step"] >= 1]
    seen = [[json.loads(x) for x in (run_dir / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()]
            for row in rows] if dumps else []
    return rows, seen


def test_reward_raising_on_ten_percent_of_samples(tmp_path, caplog):
    """A list-in, list-out reward function that cannot score about 10% of the samples raises for their whole
    group call; the worker retries that group sample by sample, so exactly the unscorable samples are masked."""
    from tests.e2e import rewards

    rewards.FLAGGED.clear()
    steps = 6
    with caplog.at_level(logging.WARNING, logger="credo.rewards"):
        rows, seen = run_in_process(tmp_path / "run", dumps=True, **{
            "run.steps": steps, "run.eval_every": 0, "reward.function": "tests.e2e.rewards:raises_on_tenth_sample"})
    failed = [[d for d in dumped if not d["reward_valid"]] for dumped in seen]
    assert [row["train/reward_failures"] for row in rows] == [len(f) for f in failed]  # samples, not groups
    assert sum(len(f) for f in failed) == len(rewards.FLAGGED) > 0
    assert [row["train/reward_timeouts"] for row in rows] == [0] * steps
    # a failed sample's group mates kept their scores: some group has both
    groups = {}
    for step, dumped in enumerate(seen):
        for d in dumped:
            groups.setdefault((step, d["prompt"]), []).append(d["reward_valid"])
    assert any(True in v and False in v for v in groups.values())
    # a failed sample is masked from the loss (no trained token, advantage 0); the rest still train
    for dumped in failed:
        assert all(not d["trained"] and not any(d["advantages"]) for d in dumped)
    assert any(d["trained"] for dumped in seen for d in dumped if d["reward_valid"])
    assert all(torch.isfinite(torch.tensor(row["train/grad_norm"])) for row in rows)
    logged = [m for m in caplog.messages if "failed at step" in m]
    assert len(logged) == 1 and "RuntimeError: injected reward failure" in logged[0]


def test_reward_sleeping_past_the_timeout(tmp_path):
    from tests.reliability import rewards

    rewards.SLEPT.clear()
    steps = 3
    rows, _ = run_in_process(tmp_path / "run", **{
        "run.steps": steps, "run.eval_every": 0, "reward.function": "tests.reliability.rewards:sleeps_on_even_prompt",
        "reward.timeout_s": 0.3, "reward.max_failure_frac": 1.0})
    assert len(rewards.SLEPT) == steps * PROMPTS
    # a timed-out group call is not retried: its 4 samples are masked and counted
    expected = [4 * sum(rewards.SLEPT[i * PROMPTS:(i + 1) * PROMPTS]) for i in range(steps)]
    assert sum(expected) > 0, "the data should make some calls sleep"
    assert [row["train/reward_timeouts"] for row in rows] == expected
    assert [row["train/reward_failures"] for row in rows] == expected  # failures count timeouts too


def checkpoint_tensors(ckpt: Path):
    """(file, tensor) for every floating tensor in every .pt file of a checkpoint (model and optimizer states)."""
    def walk(obj):
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point():
                yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from walk(v)

    for f in sorted(ckpt.rglob("*.pt")):
        for t in walk(torch.load(f, map_location="cpu", weights_only=False)):
            yield f.relative_to(ckpt), t


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_nan_loss_step_is_skipped_and_never_saved(tmp_path, monkeypatch, caplog, zero_stage):
    monkeypatch.setenv("CREDO_FAULT_NAN_STEP", "2")
    with caplog.at_level(logging.ERROR, logger="credo"):
        rows, _ = run_in_process(tmp_path / "run", **{"run.steps": 4, "run.eval_every": 0, "run.save_every": 1,
                                                      "run.keep_last": 10, "optim.zero_stage": zero_stage})
    assert [row["train/skipped_steps"] for row in rows] == [0, 1, 0, 0]
    assert [row["train/skipped_total"] for row in rows] == [0, 1, 1, 1]
    assert any("step 2: optimizer step skipped, non-finite loss" in m for m in caplog.messages), caplog.messages
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == [f"step_{s:08d}" for s in (1, 2, 3, 4)]
    n = 0
    for ckpt in ckpts:
        for f, t in checkpoint_tensors(ckpt):
            assert torch.isfinite(t).all(), f"non-finite tensor in {ckpt.name}/{f}"
            n += 1
    assert n > 0

    p1, p2, p3 = (final_params(tmp_path / "run", s) for s in (1, 2, 3))
    assert all(torch.equal(p1[k], p2[k]) for k in p1), "the skipped step must not move the weights"
    # nor the optimizer: Adam moments and step counts in the checkpoints before and after it are equal
    before, after = list(checkpoint_tensors(ckpts[0])), list(checkpoint_tensors(ckpts[1]))
    assert [f for f, _ in before] == [f for f, _ in after]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(before, after))
    assert not all(torch.equal(p2[k], p3[k]) for k in p2), "training goes on after the skipped step"


def test_consecutive_nan_steps_stop_the_run(tmp_path):
    out = tmp_path / "run"
    run_cli_expecting_error(
        ["run", "recipes/quickstart.yaml"] + tiny_overrides(out, **{"run.steps": 5, "run.eval_every": 0, "run.save_every": 1,
                                                                   "run.max_consecutive_skips": 2}),
        exit_code=1, CREDO_FAULT_NAN_STEP="2-3",
        message="credo: error: 2 consecutive optimizer steps skipped for non-finite values "
                "(run.max_consecutive_skips=2); stopping at step 3")
    assert [row["step"] for row in read_rows(out)] == [1, 2]
    assert [c.name for c in sorted((out / "checkpoints").glob("step_*"))] == ["step_00000001", "step_00000002"]
