"""Kill test of tail batching (`rollout.tail_batching`) with packed training: a run SIGKILLed mid-way and resumed
with run.resume=auto equals an uninterrupted run (metrics.jsonl less perf/*, final parameters bit for bit).

With 4 prompts a step, each short round races 5 and queues the one that lost, so the queue holds 4 prompts after
step 4 and step 5 is a long round on them. The run is killed once step 5's row is logged, after the checkpoint of
step 4: the resumed run must restore the queue and the draw position from that checkpoint, or its step 5 would be
a short round on other prompts.
"""

from __future__ import annotations

import json

import pytest

from credo.checkpoint import list_checkpoints
from tests.reliability.common import assert_same_run, has_row, kill_recipe, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

TAIL = {"rollout.tail_batching": "{}", "algo.packing": "true", "algo.micro_batch_tokens": 40}


def test_kill_and_resume_restores_the_long_prompt_queue(tmp_path):
    base = start(kill_recipe(tmp_path / "uninterrupted", **TAIL), tmp_path / "uninterrupted.log")
    out = tmp_path / "run"
    run_and_kill(kill_recipe(out, **TAIL), has_row(out, 5), tmp_path / "killed.log")
    resume_from = list_checkpoints(out / "checkpoints")[-1]
    assert resume_from.name == "step_00000004"
    queue = json.loads((resume_from / "meta.json").read_text())["components"]["source"]["ranks"][0]["queue"]
    assert len(queue) == 4  # what step 5's long round trains on
    err = wait_ok(start(kill_recipe(out, **TAIL, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    assert f"resumed from {resume_from}" in err
    wait_ok(base)
    assert_same_run(tmp_path / "uninterrupted", out, 6)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("rollout/long_round") for r in rows[1:]] == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
