"""Strict recipe loading: unknown keys, wrong types, ranges, missing files, overrides."""

from credo.plan import resolve_plan
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
        resolve_plan(load_recipe(QUICKSTART, ["algo.policy_loss=cipso"]))  # names: by the run plan (credo check)


def test_loss_kwargs_checked_against_signature():
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.loss_kwargs.clip_hgh'; did you mean 'algo.loss_kwargs.clip_high'"):
        resolve_plan(load_recipe(QUICKSTART, ["algo.loss_kwargs={clip_hgh: 0.3}"]))
    # the shared keywords of every loss (train/inference correction) are accepted too
    r = load_recipe(QUICKSTART, ["algo.loss_kwargs={correction: tis, correction_cap: 2.0}"])
    assert r.algo.loss_kwargs["correction"] == "tis"
    with pytest.raises(ConfigError, match="set by the trainer"):
        resolve_plan(load_recipe(QUICKSTART, ["algo.loss_kwargs={global_tokens: 3}"]))


def test_advantage_kwargs_checked():
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs.norm_sdt.*did you mean 'algo.advantage_kwargs.norm_std'"):
        resolve_plan(load_recipe(QUICKSTART, ["algo.advantage_kwargs={norm_sdt: false}"]))


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


# ------------------------------------------------------------------------------ overrides into mappings


def test_dict_override_replaces_the_mapping():
    # quickstart.yaml sets task.kwargs to {max_operand: 49, ops: "+", fixed_width: true}
    assert load_recipe(QUICKSTART, ["task.kwargs={}"]).task.kwargs == {}
    assert load_recipe(QUICKSTART, ["task.kwargs={max_operand: 20}"]).task.kwargs == {"max_operand": 20}
    base = "recipes/ablations/tricks_or_traps_qwen3_4b.yaml"  # sets algo.loss_kwargs {clip_low: 0.2, clip_high: 0.2}
    assert load_recipe(base, ["algo.loss_kwargs={clip_high: 0.28}"]).algo.loss_kwargs == {"clip_high": 0.28}


def test_dotted_override_into_a_mapping_merges():
    r = load_recipe(QUICKSTART, ["task.kwargs.max_operand=20"])
    assert r.task.kwargs == {"max_operand": 20, "ops": "+", "fixed_width": True}
    r = load_recipe(QUICKSTART, ["task.kwargs={}", "task.kwargs.ops=+-"])  # in order: replace, then merge
    assert r.task.kwargs == {"ops": "+-"}


def test_switching_the_quickstart_to_a_reasoning_gym_task():
    pytest.importorskip("reasoning_gym")
    from credo.tasks import make_task

    small = ["task.name=rg:basic_arithmetic", "task.train_size=20", "task.eval_size=5"]
    with pytest.raises(ConfigError, match="max_operand"):  # the arithmetic task's kwargs do not fit reasoning-gym
        make_task(load_recipe(QUICKSTART, small).task)
    task = make_task(load_recipe(QUICKSTART, small + ["task.kwargs={}"]).task)
    assert task.train(0).prompt


def test_override_below_a_scalar_names_it():
    with pytest.raises(ConfigError, match=r"override 'run.steps.x=1' sets a key below the non-mapping 'steps'"):
        load_recipe(QUICKSTART, ["run.steps.x=1"])


def test_bad_yaml_value_names_the_override():
    with pytest.raises(ConfigError, match=r"override 'run.steps=\[1': value is not valid YAML"):
        load_recipe(QUICKSTART, ["run.steps=[1"])


# ------------------------------------------------------------------------------- ranges beside the fields


@pytest.mark.parametrize("key, edge, beyond, expected", [
    ("run.steps", 1, 0, ">= 1"),
    ("run.eval_every", 0, -1, ">= 0"),
    ("sft.noisy_frac", 1.0, 1.5, "in [0, 1]"),
    ("sft.lr", 1e-9, 0.0, "> 0"),
    ("rollout.top_p", 1.0, 0.0, "in (0, 1]"),
    ("rollout.temperature", 0.01, 0.0, "> 0 (greedy decoding is used only for eval)"),
    ("engine.zero_stage", 3, 4, "0, 1, 2 or 3"),
    ("optim.zero_stage", 3, 4, "0, 1, 2 or 3 (deprecated: write engine.zero_stage)"),
    ("model.dtype", "bfloat16", "float16", "float32 or bfloat16"),
    ("reward.max_failure_frac", 0.0, -0.1, "in [0, 1]"),
])
def test_field_range_edge_passes_and_beyond_fails(key, edge, beyond, expected):
    section, name = key.split(".")
    assert getattr(getattr(load_recipe(QUICKSTART, [f"{key}={edge}"]), section), name) == edge
    with pytest.raises(ConfigError) as e:
        load_recipe(QUICKSTART, [f"{key}={beyond}"])
    assert str(e.value) == f"config key '{key}' = {beyond!r} is out of range: expected {expected}"


def test_betas_need_two_numbers_below_one():
    assert load_recipe(QUICKSTART, ["optim.betas=[0.9, 0.95]"]).optim.betas == [0.9, 0.95]
    for bad in ("[0.9]", "[0.9, 1.0]"):
        with pytest.raises(ConfigError, match=r"'optim.betas' = .* expected two numbers in \[0, 1\)"):
            load_recipe(QUICKSTART, [f"optim.betas={bad}"])


def test_cross_field_checks_name_the_key():
    with pytest.raises(ConfigError, match=r"'run.eval_samples' = 4 is out of range: expected 1 when decoding greedily"):
        load_recipe(QUICKSTART, ["run.eval_temperature=0"])
    with pytest.raises(ConfigError, match=r"'model.tiny.num_heads' = 3 is out of range: expected a divisor of hidden_size"):
        load_recipe(QUICKSTART, ["model.tiny.num_heads=3"])
    with pytest.raises(ConfigError, match=r"'model.tiny.hidden_size' = 64 .* hidden_size / num_heads >= 32"):
        load_recipe(QUICKSTART, ["model.tiny.hidden_size=64"])
    assert load_recipe(QUICKSTART, ["algo.kl_coef=0.1", "model.ref_model=true"]).algo.kl_coef == 0.1


def test_ranged_words_its_bounds():
    from credo.config import one_of, ranged

    def meta(f):
        return f.metadata["expected"], f.metadata["check"]

    expected, check = meta(ranged(0.5, ge=0, lt=1))
    assert expected == "in [0, 1)" and check(0) and check(0.99) and not check(1) and not check(-0.01)
    expected, check = meta(ranged(5, le=10))
    assert expected == "<= 10" and check(-3) and check(10) and not check(11)
    expected, check = meta(one_of("a", ("a", "b")))
    assert expected == "a or b" and check("b") and not check("c")


def test_config_agg_modes_match_the_algos():
    from credo import algos
    from credo.config import AGG_MODES

    assert AGG_MODES == algos.AGG_MODES


# -------------------------------------------------------------------------- recipes that cannot run


def test_group_estimators_are_exactly_those_that_zero_a_singleton_group():
    """GROUP_ESTIMATORS against the estimators' behaviour: one sample per prompt gives all-zero advantages."""
    import torch

    from credo import algos
    from credo.algos.advantages import GROUP_ESTIMATORS

    rewards = torch.tensor([0.0, 1.0, 3.0, 0.5])
    mask = torch.ones(4, 3, dtype=torch.bool)
    outcome = [n for n, kind in algos.ADVANTAGE_INPUTS.items() if kind == "outcome"]
    zeroed = {n for n in outcome if not algos.ADVANTAGE_ESTIMATORS[n](rewards, torch.arange(4), mask).any()}
    assert zeroed == set(GROUP_ESTIMATORS)


def test_group_size_one_with_a_group_estimator_is_refused():
    from credo.algos.advantages import GROUP_ESTIMATORS

    for name in sorted(GROUP_ESTIMATORS):
        with pytest.raises(ConfigError) as e:
            resolve_plan(load_recipe(QUICKSTART, [f"algo.advantage={name}", "rollout.group_size=1"]))
        expected = f"config key 'rollout.group_size' = 1 is out of range: expected >= 2 with algo.advantage = '{name}'"
        assert expected in str(e.value)
        assert load_recipe(QUICKSTART, [f"algo.advantage={name}", "rollout.group_size=2"]).rollout.group_size == 2
    # batch whitening has a baseline with one sample per prompt
    assert load_recipe(QUICKSTART, ["algo.advantage=reinforce_pp", "rollout.group_size=1"]).rollout.group_size == 1


@pytest.mark.parametrize("name, message", [
    ("gae", "config key 'algo.advantage' = 'gae' needs a value model: set critic.num_critics >= 1"),
    ("rebn", "config key 'algo.advantage' = 'rebn' needs per-token rewards or a value model")])
def test_check_refuses_an_estimator_the_trainer_cannot_run(name, message, capsys):
    from credo.cli import main

    assert main(["check", QUICKSTART, f"algo.advantage={name}"]) == 2
    err = capsys.readouterr().err
    assert message in err


def test_a_load_leaves_the_cached_schema_as_it_was():
    """load_recipe merges into one cached structured schema per recipe type: a load's recipe and overrides must not
    reach the next load's defaults."""
    from omegaconf import OmegaConf

    from credo.config import recipe_to_dict
    from credo.config.load import _schema, recipe_class

    before = OmegaConf.to_yaml(_schema(recipe_class(())))
    quick = recipe_to_dict(load_recipe("recipes/quickstart.yaml"))
    a = load_recipe("recipes/shop.yaml", ["run.steps=7", "task.kwargs.extra=1", "algo.loss_kwargs={clip_low: 0.1}"])
    assert (a.run.steps, a.task.kwargs["extra"], a.algo.loss_kwargs) == (7, 1, {"clip_low": 0.1})
    assert recipe_to_dict(load_recipe("recipes/quickstart.yaml")) == quick
    assert OmegaConf.to_yaml(_schema(recipe_class(()))) == before
