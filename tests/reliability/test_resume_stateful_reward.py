"""A stateful reward stage survives a SIGKILL: RM-NLHF's online MetaRM (a model with its own Adam) is part of the
trainer state, so a run killed after a checkpoint and resumed equals the uninterrupted run bit for bit.

Before the family refactor only the rollout source and the advantage stage were in the trainer state: the resumed
run restarted the MetaRM from its initial weights, and its `reward/metarm_mse` and rewards (lam * MetaRM's
prediction on items without a human critique) differed from the step after the checkpoint on.
"""

from __future__ import annotations

import json

import pytest

from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok
from tests.e2e.common import tiny_overrides

pytestmark = pytest.mark.slow

STEPS = 4


def rm_nlhf_args(out, **extra) -> list[str]:
    o = tiny_overrides(out, **{"run.steps": STEPS, "run.save_every": 2, "run.eval_every": STEPS, "run.keep_last": 3,
                               "run.plot": False, "task.kwargs": "{mode: pairwise, critique: true, critique_noise: 0.5, "
                               "human_critique_frac: 0.5, max_operand: 9, fixed_width: true}",
                               "rollout.max_new_tokens": 16, "stages.reward_kwargs": "{lam: 0.5, similarity: rouge_l}",
                               **extra})
    # the outcome reward is the judging task's verifier, not tiny_overrides' reward function
    return ["run", "recipes/rm_nlhf.yaml"] + [x for x in o if not x.startswith("reward.function=")]


def test_rm_nlhf_metarm_resumes_bit_exact_after_sigkill(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    wait_ok(start(rm_nlhf_args(full), tmp_path / "full.log"))
    run_and_kill(rm_nlhf_args(killed), has_checkpoint(killed, 2), tmp_path / "killed.log")
    wait_ok(start(rm_nlhf_args(killed, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    rows = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/metarm_mse" in r for r in rows[1:]), "the MetaRM must be on in this run"
    assert_same_run(full, killed, STEPS)
