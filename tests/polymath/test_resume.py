"""A one-sample run end to end, and its exact resume after SIGKILL: killed right after the step-2 checkpoint and
resumed to step 4, it equals the uninterrupted run (metrics.jsonl less perf/*, eval/<discipline> and polymath/*
included, and the final parameters, bit for bit). The copies' seeds are functions of (run seed, step), so nothing
about the sample needs saving; this test is what keeps that true."""

from __future__ import annotations

import pytest

from tests.e2e.common import read_rows, tiny_overrides
from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

STEPS = 4
DISCIPLINES = ("{disciplines: {add: {task: add_scratch, kwargs: {digits: 1}}, sort: {task: sort, kwargs: {length: 3}}, "
               "combo: {combine: [add, sort]}}}")


def args(out, **extra) -> list[str]:
    o = {"run.steps": STEPS, "run.eval_every": 2, "run.save_every": 2, "run.keep_last": 3, "run.plot": False,
         "run.eval_temperature": 1.0, "run.eval_samples": 2, "task.kwargs": DISCIPLINES, "task.train_size": 200,
         "task.eval_size": 6, "reward.function": "null", "rollout.max_new_tokens": 24,
         "polymath.sample": "{discipline: combo, select: skills, candidates: 8}"}
    o.update(extra)
    return ["run", "recipes/polymath.yaml", *tiny_overrides(out, **o)]


def test_sigkill_after_a_checkpoint_and_resume_is_exact(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    err = wait_ok(start(args(full), tmp_path / "full.log"))
    assert "polymath: training on one sample, combo[" in err
    run_and_kill(args(killed), has_checkpoint(killed, 2), tmp_path / "killed.log")
    assert not (killed / "checkpoints" / f"step_{STEPS:08d}").exists()
    err = wait_ok(start(args(killed, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    assert "resumed from" in err
    assert_same_run(full, killed, STEPS)
    rows = read_rows(full)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for r in evals:  # the mean over the two natural disciplines (the combination is not evaluated by default)
        assert set(k for k in r if k.startswith("eval/")) == {"eval/accuracy", "eval/add", "eval/sort"}
        assert r["eval/accuracy"] == pytest.approx((r["eval/add"] + r["eval/sort"]) / 2)
    trained = [r for r in rows if r["step"] > 0]
    assert all(0 <= r["polymath/format_frac"] <= 1 and 0 < r["polymath/distinct_frac"] <= 1 for r in trained)
    assert all(r["polymath/sampled_nll"] > 0 and "polymath/reward/combo" in r for r in trained)
