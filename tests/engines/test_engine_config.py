"""The engine: section: engine.backend, and engine.zero_stage, which optim.zero_stage names for one more release."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from credo.config import ConfigError, load_recipe, recipe_to_dict
from credo.train.state import config_changes


def load(*overrides):
    return load_recipe("recipes/quickstart.yaml", list(overrides), validate_names=False)


def test_the_old_key_is_read_as_engine_zero_stage_with_a_warning_naming_the_new_one(caplog):
    with caplog.at_level(logging.WARNING, logger="credo"):
        r = load("optim.zero_stage=2")
    assert (r.engine.zero_stage, r.optim.zero_stage) == (2, 2)
    assert "'optim.zero_stage' is deprecated" in caplog.text and "engine.zero_stage: 2" in caplog.text


def test_the_new_key_alone_warns_nothing_and_the_old_one_mirrors_it(caplog):
    with caplog.at_level(logging.WARNING, logger="credo"):
        r = load("engine.zero_stage=3")
    assert (r.engine.zero_stage, r.optim.zero_stage) == (3, 3) and "deprecated" not in caplog.text
    assert load().engine.zero_stage == 1 and load().engine.backend == "deepspeed"


def test_a_rebuilt_recipe_does_not_warn_again_and_follows_a_new_engine_stage(caplog):
    """`credo ablate` hashes each run's Recipe rebuilt by dataclasses.replace: the stage __post_init__ mirrored into
    optim.zero_stage is not the user's deprecated key (it warned once per planned run), and a rebuilt Recipe with
    another engine.zero_stage follows it (it raised 'optim.zero_stage = 1 and engine.zero_stage = 2')."""
    import dataclasses

    from credo.ablate.plan import config_hash
    from credo.config.sections import EngineConfig

    r = load()
    with caplog.at_level(logging.WARNING, logger="credo"):
        config_hash(r)
        r2 = dataclasses.replace(r, engine=EngineConfig(zero_stage=2))
    assert "deprecated" not in caplog.text
    assert (r2.engine.zero_stage, r2.optim.zero_stage) == (2, 2)
    with caplog.at_level(logging.WARNING, logger="credo"):
        old = load("optim.zero_stage=2")
        dataclasses.replace(old, run=old.run)
    assert caplog.text.count("deprecated") == 1  # the user's key: once, at load


def test_both_keys_disagreeing_is_an_error_naming_both():
    with pytest.raises(ConfigError, match="'optim.zero_stage' = 2 and 'engine.zero_stage' = 3"):
        load("optim.zero_stage=2", "engine.zero_stage=3")


def test_an_unknown_backend_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="engine.backend"):
        load("engine.backend=megatron")


def test_a_checkpoint_from_before_the_rename_resumes_without_a_change():
    new = recipe_to_dict(load("engine.zero_stage=2"))
    old = {**new, "optim": dict(new["optim"]), "engine": {k: v for k, v in new["engine"].items() if k != "zero_stage"}}
    assert config_changes(old, new) == {}
    old["optim"]["zero_stage"] = 1  # it was trained on another stage: a change
    assert set(config_changes(old, new)) == {"engine.zero_stage", "optim.zero_stage"}


def test_no_shipped_recipe_or_sweep_writes_the_deprecated_key():
    """docs/engines.md says every recipe writes engine.zero_stage: one that did not (recipes/code.yaml) printed the
    deprecation warning at every `credo check` and run of it."""
    import yaml

    root = Path(__file__).resolve().parents[2] / "recipes"
    found = []
    for f in sorted(root.rglob("*.yaml")):
        text = f.read_text()
        d = yaml.safe_load(text)
        if isinstance(d, dict) and isinstance(d.get("optim"), dict) and "zero_stage" in d["optim"]:
            found.append(str(f.relative_to(root)))
        elif "optim.zero_stage" in text:  # a sweep's or variant's override
            found.append(str(f.relative_to(root)))
    assert found == []
