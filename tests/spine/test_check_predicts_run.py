"""`credo check` makes every check `credo run` makes before its first step, and ends with one OK line.

Each case here passed `credo check` before and failed `credo run` later (after a warm-up, or after the first
rollout), or ran on silently training nothing: a GEM id with no scripted expert while the warm-up is on, a first
prompt longer than env.max_total_tokens, env.max_total_tokens above the model's context, env.kwargs the env
ignores, a reward function that needs a data set column that does not exist.
"""

from __future__ import annotations

import json

import pytest

from credo.config import load_recipe
from credo.errors import ConfigError
from credo.train.build import check_run
from tests.e2e.common import run_cli

GEM = ["env.id=game:GuessTheNumber-v0-easy", "env.kwargs={max_turns: 3}"]


def check(recipe, overrides):
    return check_run(load_recipe(recipe, overrides))


def test_a_gem_env_without_an_expert_while_the_warm_up_is_on():
    with pytest.raises(ConfigError, match=r"^config key 'sft.enabled' is on, but env 'game:GuessTheNumber-v0-easy' "
                                          r"has no scripted expert"):
        check("recipes/multiturn.yaml", GEM)


def test_a_first_prompt_longer_than_the_token_budget():
    with pytest.raises(ConfigError, match=r"^config key 'env.max_total_tokens' = 64 leaves no room for a turn: the "
                                          r"first prompt of 'game:GuessTheNumber-v0-easy' \(seed 0\) is \d+ tokens"):
        check("recipes/multiturn.yaml", [*GEM, "sft.enabled=false"])


def test_a_token_budget_above_the_models_context():
    with pytest.raises(ConfigError, match=r"^config key 'env.max_total_tokens' = 2000 is more than the model's "
                                          r"context of 256 tokens"):
        check("recipes/multiturn.yaml", [*GEM, "sft.enabled=false", "env.max_total_tokens=2000"])


def test_env_kwargs_the_env_ignores():
    with pytest.raises(ConfigError, match=r"^config key 'env.kwargs.low' is not a setting of "
                                          r"'game:GuessTheNumber-v0-easy' \(its settings: min_number, max_number, "
                                          r"max_turns\)$"):
        check("recipes/multiturn.yaml", ["env.id=game:GuessTheNumber-v0-easy", "sft.enabled=false",
                                         "env.kwargs={low: 1, high: 7}"])
    with pytest.raises(ConfigError, match=r"'env.kwargs.hihg' is not a setting of 'credo:GuessNumber-v0' .*did you "
                                          r"mean 'env.kwargs.high'\?"):
        check("recipes/multiturn.yaml", ["env.kwargs={hihg: 7}"])
    check("recipes/multiturn.yaml", [])  # the built-in game's own settings pass


def needs_solution(completions, solution, **kwargs):
    return [1.0 for _ in completions]


def test_a_reward_function_needing_a_column_the_data_lacks(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(30)))
    over = ["task.name=file", f"task.kwargs={{train: {data}}}", "task.eval_size=5", "sft.enabled=false",
            f"reward.functions=[{__name__}:needs_solution]"]
    with pytest.raises(ConfigError, match=r"^config key 'reward.functions\[0\]' needs the data set column 'solution', "
                                          r"which task 'file' lacks \(columns: answer;"):
        check("recipes/quickstart.yaml", over)
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "solution": str(2 * i)}) + "\n" for i in range(30)))
    check("recipes/quickstart.yaml", over)  # with the column it passes


def test_a_task_without_a_verifier_and_no_reward_function(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}="}) + "\n" for i in range(30)))
    with pytest.raises(ConfigError, match=r"^task 'file' has no verifier: expected reward.functions"):
        check("recipes/quickstart.yaml", ["task.name=file", f"task.kwargs={{train: {data}}}", "task.eval_size=5",
                                          "sft.enabled=false"])


def test_check_ends_with_one_ok_line_and_shows_the_config_on_request():
    p = run_cli(["check", "recipes/quickstart.yaml", "run.steps=3"], timeout=300)
    assert p.returncode == 0, p.stderr
    *notes, ok = p.stdout.strip().splitlines()
    assert ok == "credo check: OK (recipes/quickstart.yaml, 1 overrides)"
    assert len(notes) == 1 and notes[0].startswith("credo: note: warm-up 'sft' (600 steps")  # cached, or its time
    p = run_cli(["check", "recipes/quickstart.yaml", "--show"], timeout=300)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and lines[-1] == "credo check: OK (recipes/quickstart.yaml)" and "run:" in lines


def test_the_issues_multiturn_run_that_trained_nothing_now_stops_before_it_starts():
    """`credo run recipes/multiturn.yaml env.id=game:GuessTheNumber-v0-easy sft.enabled=false run.steps=3` used to
    exit 0 with every episode overflowing env.max_total_tokens (and the recipe's low/high dropped by GEM)."""
    p = run_cli(["run", "recipes/multiturn.yaml", "env.id=game:GuessTheNumber-v0-easy", "sft.enabled=false",
                 "run.steps=3"], timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("credo: config error: config key 'env.kwargs.low' is not a "
                                                        "setting of 'game:GuessTheNumber-v0-easy'")
    p = run_cli(["run", "recipes/multiturn.yaml", "env.id=game:GuessTheNumber-v0-easy", "sft.enabled=false",
                 "run.steps=3", "env.kwargs={max_turns: 3}"], timeout=300)
    assert p.returncode == 2 and "leaves no room for a turn" in p.stderr.strip().splitlines()[-1]
