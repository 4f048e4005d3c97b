"""End to end: the trainer on a multi-turn env for 2 steps (built-in game, and a GEM game when gem is installed)."""

import json

import pytest

from tests.e2e.common import read_rows, run_cli, tiny_overrides

MULTITURN = {"stages.rollout": "multiturn", "stages.reward": "env", "stages.advantage": "turn_credit",
             "run.steps": 2, "run.eval_every": 2, "run.dump_rollouts_every": 2, "rollout.prompts_per_step": 2,
             "rollout.group_size": 2, "env.eval_episodes": 4}


@pytest.mark.slow
def test_builtin_game_trains_two_steps_with_ipa(tmp_path):
    o = tiny_overrides(tmp_path / "run", **MULTITURN, **{
        "env.id": "credo:GuessNumber-v0", "env.kwargs": "{low: 1, high: 7, max_turns: 3}", "env.max_turns": 3,
        "env.max_total_tokens": 64, "env.max_new_tokens_per_turn": 3, "env.expert_noise": 0.5,
        "stages.advantage_kwargs": "{credit: ipa, gamma: 0.9}", "algo.policy_loss": "ipa"})
    p = run_cli(["run", "recipes/multiturn.yaml", *o])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/return" in rows[0] and "eval/return" in rows[2]
    for r in rows[1:]:
        assert r["env/failures"] == 0 and 1 <= r["env/turns_mean"] <= 3 and "loss/chunk_dropped_frac" in r
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(dump) == 4
    for row in dump:
        chunks = row["meta"]["chunk_ids"]
        assert [c >= 0 for c in chunks] == [m == 1 for m in row["response_mask"]]
        assert max(chunks) + 1 == len(row["meta"]["turn_rewards"]) == len(row["meta"]["actions"])
        # the transcript (issue 57 A.9): role-marked turns, one agent turn per action
        assert row["transcript"].startswith("[env] ") and row["transcript"].count("\n[agent ") == len(row["meta"]["actions"])


@pytest.mark.slow
def test_gem_game_id_trains_two_steps(tmp_path):
    pytest.importorskip("gem")
    o = tiny_overrides(tmp_path / "run", **MULTITURN, **{
        "env.id": "game:GuessTheNumber-v0-easy", "env.kwargs": "{}", "env.max_turns": 4, "env.max_total_tokens": 700,
        "env.max_new_tokens_per_turn": 8, "model.tiny.max_position_embeddings": 1024, "sft.enabled": False,
        "stages.advantage_kwargs": "{credit: mc_rebn, gamma: 0.9}"})
    p = run_cli(["run", "recipes/multiturn.yaml", *o])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    # an untrained model writes no \boxed{} guess: GEM's format penalty ends every episode at turn 1
    for r in rows[1:]:
        assert r["env/failures"] == 0 and r["env/turns_mean"] >= 1 and r["train/reward_mean"] <= 1.0


@pytest.mark.slow
def test_mastermind_with_initialised_resampling_trains_two_steps(tmp_path):
    o = tiny_overrides(tmp_path / "run", **MULTITURN, **{
        "env.id": "credo:Mastermind-v0", "env.kwargs": "{positions: 2, colours: 3, max_turns: 4}", "env.max_turns": 4,
        "env.max_total_tokens": 64, "env.max_new_tokens_per_turn": 3, "env.expert_noise": 0.5,
        "env.init_resample_frac": 0.5, "stages.advantage_kwargs": "{credit: ipa, gamma: 0.9}", "algo.policy_loss": "ipa"})
    p = run_cli(["run", "recipes/multiturn_mastermind.yaml", *o])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:  # the first of each game's 2 episodes starts from a prefix (unless the expert needs 1 turn)
        assert r["env/failures"] == 0 and 0 < r["env/resampled_frac"] <= 0.5 and r["env/prefix_turns_mean"] > 0
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    for row in dump:
        prefix = row["meta"]["prefix_actions"]
        assert len(prefix) + len(row["meta"]["actions"]) <= 4
        assert all(a in row["prompt"] for a in prefix)  # the replayed turns are in the prompt, not trained


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.heavy  # a vLLM engine start-up: about a minute
def test_builtin_game_on_the_vllm_backend(tmp_path):
    """The multi-turn source on vLLM: one generate call per turn through the engine, the same layout and chunk
    ids as on hf, and the engine's log-probs of the model's tokens agree with the trainer's (K3 near 0)."""
    pytest.importorskip("vllm")
    o = tiny_overrides(tmp_path / "run", **MULTITURN, **{
        "rollout.backend": "vllm", "env.id": "credo:GuessNumber-v0", "env.kwargs": "{low: 1, high: 7, max_turns: 3}",
        "env.max_turns": 3, "env.max_total_tokens": 64, "env.max_new_tokens_per_turn": 3, "env.expert_noise": 0.5,
        "stages.advantage_kwargs": "{credit: mc_rebn, gamma: 0.9}"})
    p = run_cli(["run", "recipes/multiturn.yaml", *o])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/return" in rows[2]
    for r in rows[1:]:
        assert r["env/failures"] == 0 and 1 <= r["env/turns_mean"] <= 3
        assert 0 <= r["mismatch/k3"] < 1e-3, r["mismatch/k3"]  # fp32 engine and trainer: the same policy
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    for row in dump:
        chunks = row["meta"]["chunk_ids"]
        assert [c >= 0 for c in chunks] == [m == 1 for m in row["response_mask"]]
        assert max(chunks) + 1 == len(row["meta"]["turn_rewards"]) == len(row["meta"]["actions"])
