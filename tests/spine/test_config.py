"""Strict recipe loading: unknown keys, wrong types, ranges, missing files, overrides."""

import pytest

from credo.config import ConfigError, load_recipe

QUICKSTART = "recipes/quickstart.yaml"


def test_quickstart_loads_with_overrides():
    r = load_recipe(QUICKSTART, ["run.steps=3", "algo.loss_kwargs={clip_high: 0.28}", "rollout.backend=vllm"])
    assert r.run.steps == 3
    assert r.algo.loss_kwargs == {"clip_high": 0.28}
    assert r.rollout.backend == "vllm"
    assert r.run.name == "quickstart"


def test_misspelled_key_names_key_path_and_suggestion():
    with pytest.raises(ConfigError) as e:
        load_recipe(QUICKSTART, ["algo.polcy_loss=ppo"])
    msg = str(e.value)
    assert "algo.polcy_loss" in msg and "did you mean 'algo.policy_loss'" in msg


def test_misspelled_key_in_yaml_file(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("run:\n  name: x\nrollout:\n  group_sise: 4\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.group_sise'; did you mean 'rollout.group_size'"):
        load_recipe(f)


def test_unknown_top_level_section():
    with pytest.raises(ConfigError, match=r"unknown config key 'optimizer'.*did you mean 'optim'"):
        load_recipe(QUICKSTART, ["optimizer.lr=1"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError) as e:
        load_recipe(QUICKSTART, ["run.steps=ten"])
    assert "run.steps" in str(e.value)


def test_out_of_range_names_key_and_expectation():
    with pytest.raises(ConfigError, match=r"'rollout.top_p' = 1.5 is out of range: expected in \(0, 1\]"):
        load_recipe(QUICKSTART, ["rollout.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"'algo.kl_coef'.*model.ref_model"):
        load_recipe(QUICKSTART, ["algo.kl_coef=0.1"])


def test_missing_file_names_path():
    with pytest.raises(ConfigError, match=r"recipe file not found: 'recipes/nope.yaml'"):
        load_recipe("recipes/nope.yaml")


def test_unknown_registry_name_suggests():
    with pytest.raises(ConfigError, match=r"'algo.policy_loss' = 'cipso'.*did you mean 'cispo'"):
        load_recipe(QUICKSTART, ["algo.policy_loss=cipso"])


def test_loss_kwargs_checked_against_signature():
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.loss_kwargs.clip_hgh'; did you mean 'algo.loss_kwargs.clip_high'"):
        load_recipe(QUICKSTART, ["algo.loss_kwargs={clip_hgh: 0.3}"])
    # the shared keywords of every loss (train/inference correction) are accepted too
    r = load_recipe(QUICKSTART, ["algo.loss_kwargs={correction: tis, correction_cap: 2.0}"])
    assert r.algo.loss_kwargs["correction"] == "tis"
    with pytest.raises(ConfigError, match="set by the trainer"):
        load_recipe(QUICKSTART, ["algo.loss_kwargs={global_tokens: 3}"])


def test_advantage_kwargs_checked():
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs.norm_sdt.*did you mean 'algo.advantage_kwargs.norm_std'"):
        load_recipe(QUICKSTART, ["algo.advantage_kwargs={norm_sdt: false}"])


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_recipe(QUICKSTART, ["run.steps"])


def test_every_recipe_in_repo_loads():
    from pathlib import Path

    import yaml

    for path in sorted(Path("recipes").rglob("*.yaml")):
        if "base" in (yaml.safe_load(path.read_text()) or {}):  # a sweep file (credo ablate), checked in tests/ablate
            continue
        load_recipe(path)


def test_recipe_without_run_name_says_the_key_is_required(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("task: {name: arithmetic}\n")
    with pytest.raises(ConfigError, match=r"config key 'run.name' is required but was not set"):
        load_recipe(path)
