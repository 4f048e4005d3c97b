"""End to end (heavy: a warm-up, then RL through HTTP): recipes/gateway_shop.yaml's unmodified OpenAI Agents SDK
agent trains through the gateway for two steps on credo:Shop-v0-tiny; its reward is logged, and the dumped rollouts'
mask-1 runs are the agent's turns."""

from __future__ import annotations

import json

import pytest

from tests.e2e.common import read_rows, run_cli

pytest.importorskip("agents")  # openai-agents
pytest.importorskip("uvicorn")

FAST = ["run.steps=2", "run.eval_every=2", "run.dump_rollouts_every=2", "run.progress=false", "run.plot=false",
        "sft.steps=20", "sft.batch_size=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "agent.eval_episodes=2"]


@pytest.mark.heavy
def test_the_agents_sdk_recipe_trains_two_steps_and_logs_the_agents_reward(tmp_path):
    p = run_cli(["run", "recipes/gateway_shop.yaml", f"run.output_dir={tmp_path / 'run'}", *FAST])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval/agent_reward" in rows[0] and "eval/agent_reward" in rows[2]
    for r in rows[1:]:
        assert r["agent/episodes"] == 4 and r["agent/failures"] == 0
        assert r["train/reward_mean"] == pytest.approx(r["agent/reward_mean"])
        assert r["gateway/requests"] >= 4 and -0.4 <= r["agent/reward_mean"] <= 1.0
        assert r["gateway/retokenization_drift"] == 0  # the SDK echoes its history as sampled
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(dump) >= 4
    for row in dump:
        runs = sum(1 for i, m in enumerate(row["response_mask"]) if m and (i == 0 or not row["response_mask"][i - 1]))
        assert runs == len(row["meta"]["turn_rewards"]) == len(row["meta"]["turn_spans"])
