"""The core names no family: credo/train, credo/config and credo/trainer.py import no module of credo/families,
mention none by its dotted name, and read no family section of a recipe (`r.critic`, `r.env`, ...); importing
credo.config loads no other credo module but credo.errors; the old import paths still work, with a warning."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = sorted([*(ROOT / "credo" / "train").glob("*.py"), *(ROOT / "credo" / "config").glob("*.py"),
               ROOT / "credo" / "trainer.py"])
SECTIONS = ("critic", "mipu", "env", "judge", "polymath")  # the built-in families' recipe sections


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_core_files_exist_and_the_scan_sees_them():
    names = {p.name for p in CORE}
    assert {"build.py", "trainer.py", "load.py", "sections.py", "update.py", "state.py"} <= names


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_module_names_no_family(path):
    src = path.read_text()
    tree = ast.parse(src)
    assert not [m for m in _imports(tree) if m.startswith("credo.families")], "imports a family module"
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if "credo.families." in s], "names a family module in a string"
    reads = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id in ("r", "recipe") and n.attr in SECTIONS]
    assert not reads, f"reads a family section of the recipe: {reads}"


def test_the_family_reads_in_the_core_are_caught_by_the_scan():
    """The scan above is not vacuous: the pre-refactor builder's reads would be found."""
    tree = ast.parse("if r.critic.num_critics: pass\nfrom credo.families.mipu import gate\n")
    assert [m for m in _imports(tree) if m.startswith("credo.families")]
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "r"
            and n.attr == "critic"]


def test_importing_config_loads_only_errors():
    code = ("import sys, credo.config\n"
            "print(sorted(m for m in sys.modules if m.startswith('credo')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(eval(out.stdout))
    allowed = {"credo", "credo._moved", "credo.errors"}
    assert {m for m in loaded if not (m == "credo.config" or m.startswith("credo.config."))} <= allowed, loaded


def test_loading_a_recipe_imports_only_the_families_config_modules():
    """Stages, hooks and models load when a recipe uses them; the table costs only the config modules."""
    code = ("import sys\nfrom credo.config import load_recipe\n"
            "load_recipe('recipes/quickstart.yaml', validate_names=False)\n"
            "print(sorted(m for m in sys.modules if m.startswith('credo.families')))\n"
            "print(sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    families, heavy = (eval(line) for line in out.stdout.splitlines())
    others = [m for m in families if m.count(".") > 2 and not m.endswith(".config")]
    assert "credo.families.critic.config" in families and not others, others
    assert heavy == [], heavy


def test_old_module_paths_warn_and_forward():
    from credo._moved import MODULES

    for old, new in MODULES.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        target = importlib.import_module(new)
        public = [n for n in vars(target) if not n.startswith("__")]
        assert public and all(getattr(module, n) is getattr(target, n) for n in public), old


def test_moved_attributes_and_the_problem_contract():
    import credo.config
    import credo.rewards.tasks
    from credo.families.critic.config import CriticConfig
    from credo.tasks import Problem, make_task

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Problem is the reward-function contract: no warning
        from credo.rewards.tasks import Problem as P
    assert P is Problem
    with pytest.warns(DeprecationWarning, match="credo.tasks.make_task"):
        assert credo.rewards.tasks.make_task is make_task
    with pytest.warns(DeprecationWarning, match="credo.families.critic.config.CriticConfig"):
        assert credo.config.CriticConfig is CriticConfig
    with pytest.raises(AttributeError):
        credo.config.NoSuchThing  # noqa: B018
