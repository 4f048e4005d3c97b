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
