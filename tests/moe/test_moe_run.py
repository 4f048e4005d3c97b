"""recipes/moe.yaml end to end (heavy: a warm-up and two short runs): the hf rollout records routing, the trainer
replays it, and every step logs the moe/* and mismatch/* metrics, with and without replay (docs/moe.md)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


@pytest.mark.parametrize("replay", [True, False])
def test_the_moe_recipe_trains_and_logs_routing_and_mismatch(tmp_path, replay):
    import credo

    run_dir = credo.train("recipes/moe.yaml", {
        "run.steps": 2, "run.eval_every": 0, "run.output_dir": str(tmp_path / "run"), "run.progress": False,
        "run.plot": False, "sft.steps": 5, "rollout.prompts_per_step": 8, "algo.router_replay": replay})
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert {"mismatch/k3", "mismatch/ess", "moe/router_disagreement"} <= set(r)
        if replay:
            assert r["moe/routing_disagreement"] == 0.0  # the experts the trainer ran are the rollout's
        else:
            assert r["moe/routing_disagreement"] == r["moe/router_disagreement"]
