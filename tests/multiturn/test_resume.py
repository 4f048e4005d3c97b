"""Exact resume of a multi-turn IPA run with initialised resampling: killed right after the step-2 checkpoint
and resumed to step 4, it equals the uninterrupted run (metrics.jsonl less perf/*, and the final parameters,
bit for bit).

The env seeds, sampling seeds and resampling anchors of a step are functions of (run seed, step), and each
episode gets a fresh env, so nothing about the episodes needs saving; this test is what keeps that true.
"""

from __future__ import annotations

import pytest

from tests.e2e.common import read_rows, tiny_overrides
from tests.multiturn.test_train import MULTITURN
from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

STEPS = 4


def args(out, **extra) -> list[str]:
    o = {**MULTITURN, "run.steps": STEPS, "run.eval_every": 2, "run.save_every": 2, "run.keep_last": 3,
         "run.dump_rollouts_every": 0, "run.plot": False, "env.id": "credo:GuessNumber-v0",
         "env.kwargs": "{low: 1, high: 7, max_turns: 3}", "env.max_turns": 3, "env.max_total_tokens": 64,
         "env.max_new_tokens_per_turn": 3, "env.expert_noise": 0.5,
         "stages.advantage_kwargs": "{credit: ipa, gamma: 0.9}", "algo.policy_loss": "ipa",
         "algo.ppo_epochs": 2, "env.init_resample_frac": 0.5}
    o.update(extra)
    return ["run", "recipes/multiturn.yaml", *tiny_overrides(out, **o)]


def test_sigkill_after_a_checkpoint_and_resume_is_exact(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    wait_ok(start(args(full), tmp_path / "full.log"))
    run_and_kill(args(killed), has_checkpoint(killed, 2), tmp_path / "killed.log")
    assert not (killed / "checkpoints" / f"step_{STEPS:08d}").exists()
    err = wait_ok(start(args(killed, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    assert "resumed from" in err
    assert_same_run(full, killed, STEPS)
    trained = [r for r in read_rows(full) if "env/resampled_frac" in r]
    assert len(trained) == STEPS and all(r["env/resampled_frac"] > 0 for r in trained)
