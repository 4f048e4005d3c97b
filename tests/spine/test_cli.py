"""`credo --version` and `credo list`."""

import re
from pathlib import Path

import pytest

from credo.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert capsys.readouterr().out.strip() == f"credo {version}"


def _section(out: str, title: str) -> list[str]:
    """The comma-separated names under the header that starts with `title`."""
    block = next(b for b in out.split("\n\n") if b.startswith(title))
    body = block.split(":\n", 1)[1]
    return [n.strip() for n in body.replace("\n", " ").split(",")]


def test_list_prints_every_registered_name(capsys):
    from credo import algos
    from credo.algos.advantages import GROUP_ESTIMATORS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert set(_section(out, "policy losses (algo.policy_loss)")) == set(algos.POLICY_LOSSES)
    assert set(_section(out, "KL estimators")) == set(algos.KL_ESTIMATORS)
    listed = _section(out, "advantage estimators (algo.advantage")
    library = _section(out, "advantage estimators in credo.algos only")
    critic = _section(out, "advantage estimators with value models")
    assert {n.rstrip("*") for n in listed + library + critic} == set(algos.ADVANTAGE_ESTIMATORS)
    assert {n.rstrip("*") for n in listed if n.endswith("*")} == set(GROUP_ESTIMATORS)
    assert set(library) == {"rebn"}  # the trainer cannot run it (credo check refuses it)
    assert critic == ["gae"]  # runs with a critic: section
    from credo.tasks import TASKS, task_names

    assert {"arithmetic", "add_scratch", "mul_scratch", "sort"} <= set(TASKS)
    assert {"judge_arithmetic", "ce_rm_arithmetic", "pgenrm_users"} <= set(task_names())  # the judges family's
    tasks_block = out.split("tasks (task.name):\n", 1)[1].split("\n  file: ", 1)[0]  # wrapped over lines
    assert [n.strip() for n in tasks_block.replace("\n", " ").split(",")] == task_names()
    assert "\n  file: " in out and "\n  hf:<name-or-folder>: " in out
    assert "\n  rg:<name>" in out
    assert "strategy: local, global, coupled" in out and "ipa:" in out and "flow_gamma" in out


def test_list_names_reasoning_gym_datasets(capsys):
    pytest.importorskip("reasoning_gym")
    from reasoning_gym.factory import DATASETS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"rg:<name>, {len(DATASETS)} reasoning-gym datasets:" in out
    names = out.split("reasoning-gym datasets:\n", 1)[1].split("\n\n", 1)[0]
    assert [n.strip() for n in names.replace("\n", " ").split(",")] == sorted(DATASETS)


def _subcommands():
    import argparse

    from credo.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub


def test_every_subcommand_and_every_argument_has_help_text():
    """#36 item 9: `credo <cmd> --help` explains each argument (simulate parses its own arguments)."""
    import argparse

    sub = _subcommands()
    described = {a.dest for a in sub._choices_actions if a.help}
    assert described == set(sub.choices)
    for name, parser in sub.choices.items():
        if name == "simulate":
            continue
        bare = [a.option_strings or a.dest for a in parser._actions
                if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
        assert not bare, f"credo {name}: arguments without help text: {bare}"


def test_list_shows_aggregation_modes_stages_env_ids_and_the_shipped_recipes(capsys):
    """#36 item 9: what a recipe can name, including the recipes beside the package (read here from the folder)."""
    import os

    from credo.config import AGG_MODES
    from credo.families.multiturn.envs import BUILTIN_ENVS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert _section(out, "loss aggregation (algo.agg_mode)") == list(AGG_MODES)
    envs = _block(out, "environments (env.id")
    builtin = envs[:next(i for i, line in enumerate(envs) if line.startswith("GEM ids"))]  # wrapped over lines
    assert {n.strip() for line in builtin for n in line.split(",")} >= set(BUILTIN_ENVS)
    stages = _block(out, "stages (or 'package.module:factory')")
    for kind, names in {"rollout": ["default", "multiturn"], "reward": ["default", "judge", "env"],
                        "advantage": ["default", "critic", "turn_credit"], "probe": ["attention_credit"]}.items():
        line = stages[stages.index(next(x for x in stages if x.startswith(f"{kind} (stages."))) + 1]
        assert set(names) <= {n.strip() for n in line.split(",")}, (kind, line)
    recipes = _block(out, "recipes (credo run RECIPE)")
    listed = {n.strip() for line in recipes[:recipes.index("paper-scale GPU configs:")] for n in line.split(",")}
    assert listed - {""} == {f"recipes/{f}" for f in os.listdir(REPO / "recipes") if f.endswith(".yaml")}


def _block(out: str, title: str) -> list[str]:
    """The stripped lines under the header that starts with `title`."""
    block = next(b for b in out.split("\n\n") if b.startswith(title))
    return [line.strip() for line in block.split("\n")[1:]]


def test_the_did_you_mean_list_of_env_ids_has_no_duplicates():
    """#36 item 9: close ids come from the built-ins and GEM's registry, each once."""
    from credo.errors import ConfigError
    from credo.families.multiturn.envs import check_env_id

    pytest.importorskip("gem")
    for typo in ("game:GuessTheNumber-v0-eazy", "credo:GuessNumbr-v0", "game:Mastermind-v0-eazy"):
        with pytest.raises(ConfigError, match="close ids: ") as e:
            check_env_id(typo)
        close = str(e.value).split("close ids: ", 1)[1].split(" (built-in", 1)[0].split(", ")
        assert len(close) == len(set(close)) >= 1, close
