"""End to end (heavy: a warm-up, then RL through HTTP): recipes/gateway_gem.yaml's unmodified `openai` agent trains
through the gateway for two steps with each credit (ReBN, IPA with turns as chunks, episode-level GRPO), its reward
logged, and the dumped rollouts' mask-1 tokens are the agent's turns."""

from __future__ import annotations

import json

import pytest

from tests.e2e.common import read_rows, run_cli

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

FAST = ["run.steps=2", "run.eval_every=2", "run.dump_rollouts_every=2", "run.progress=false", "run.plot=false",
        "sft.steps=30", "sft.batch_size=8", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "agent.eval_episodes=4"]


@pytest.mark.heavy
@pytest.mark.parametrize("credit", [
    ["stages.advantage_kwargs={credit: mc_rebn, gamma: 0.9}"],
    ["stages.advantage_kwargs={credit: ipa, gamma: 0.9}", "algo.policy_loss=ipa"],
    ["stages.advantage=default", "stages.advantage_kwargs={}", "algo.advantage=grpo"],
], ids=["rebn", "ipa", "grpo"])
def test_the_gateway_recipe_trains_two_steps_and_logs_the_agents_reward(credit, tmp_path):
    p = run_cli(["run", "recipes/gateway_gem.yaml", f"run.output_dir={tmp_path / 'run'}", *FAST, *credit])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "HTTP Request: POST" not in p.stderr  # the agents' client logs stay out of credo's log
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval/agent_reward" in rows[0] and "eval/agent_reward" in rows[2]
    for r in rows[1:]:
        assert r["agent/episodes"] == 4 and r["agent/failures"] == 0
        assert r["train/reward_mean"] == pytest.approx(r["agent/reward_mean"])
        assert r["gateway/requests"] >= 4 and -0.1 <= r["agent/reward_mean"] <= 1.0
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(dump) >= 4
    for row in dump:
        runs = sum(1 for i, m in enumerate(row["response_mask"]) if m and (i == 0 or not row["response_mask"][i - 1]))
        assert runs == len(row["meta"]["turn_rewards"]) == len(row["meta"]["turn_spans"])
