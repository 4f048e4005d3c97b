"""The Python API (credo.api): `import credo` stays light and `credo.train` is callable even after the
`credo.train` package is imported; a recipe given as a path, a dict, an OmegaConf config or a Recipe, with
overrides as a list or a dict and sections as keywords, loads to the recipe the CLI would load; errors name
the key. (A real `credo.train` run: tests/spine/test_eval_saved_model.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import credo
from credo.api import load
from credo.config import ConfigError, load_recipe, recipe_to_dict

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def test_import_credo_is_light_and_the_api_is_there():
    code = ("import sys, credo\n"
            "heavy = [m for m in ('deepspeed', 'vllm', 'transformers', 'peft', 'omegaconf') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert callable(credo.train) and callable(credo.check) and callable(credo.evaluate)\n"
            "import credo.train.build\n"  # the package credo.train is bound to the name again: still callable
            "assert callable(credo.train) and credo.train.build.build\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_every_form_of_a_recipe_loads_to_what_the_cli_loads():
    cli = load_recipe(str(QUICKSTART), ["run.steps=7", "optim.lr=0.001", "algo.loss_kwargs={clip_high: 0.3}"])
    data = yaml.safe_load(QUICKSTART.read_text())
    forms = [
        load(QUICKSTART, ["run.steps=7", "optim.lr=0.001", "algo.loss_kwargs={clip_high: 0.3}"]),
        load(str(QUICKSTART), {"run.steps": 7, "optim.lr": 1e-3, "algo.loss_kwargs": {"clip_high": 0.3}}),
        load(data, run={"steps": 7}, optim={"lr": 1e-3}, algo={"loss_kwargs": {"clip_high": 0.3}}),
        load(OmegaConf.create(data), ["run.steps=7"], optim={"lr": 1e-3}, algo={"loss_kwargs": {"clip_high": 0.3}}),
        load(load_recipe(str(QUICKSTART)), {"run.steps": 7, "optim.lr": 1e-3},
             algo={"loss_kwargs": {"clip_high": 0.3}}),
    ]
    for r in forms:
        assert recipe_to_dict(r) == recipe_to_dict(cli)
    assert data["run"]["steps"] == 100  # the caller's dict is not modified


def test_a_kwargs_mapping_is_replaced_whole_and_other_sections_key_by_key():
    r = load(QUICKSTART, task={"kwargs": {"max_operand": 9}}, run={"steps": 3})
    assert r.task.kwargs == {"max_operand": 9}  # not merged with the recipe's {ops, fixed_width, ...}
    assert r.run.name == "quickstart" and r.run.eval_every == 20  # the rest of run: kept


def test_errors_name_the_key_or_the_argument():
    with pytest.raises(ConfigError, match="did you mean 'optim.lr'"):
        load(QUICKSTART, {"optim.lrr": 1.0})
    with pytest.raises(ConfigError, match="did you mean 'run.steps'"):
        load(QUICKSTART, run={"stepz": 1})
    with pytest.raises(ConfigError, match=r"config key 'run.steps' = 0 is out of range"):
        credo.check(QUICKSTART, run={"steps": 0})
    with pytest.raises(TypeError, match="expected a YAML path, a dict, an OmegaConf config"):
        load(42)
    with pytest.raises(TypeError, match="overrides is a string"):
        load(QUICKSTART, "run.steps=3")


def test_check_runs_the_checks_of_credo_check():
    assert credo.check(QUICKSTART, ["run.steps=3"]) == []
    with pytest.raises(ConfigError, match="reward.function"):
        credo.check(QUICKSTART, {"reward.function": "no_such_module:fn"})
