"""`credo ablate --dry-run` writes nothing anywhere, and every flag of every `credo` subcommand has help text."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from credo import cli

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, tuple]:
    """Every file and folder under root with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def test_dry_run_writes_nothing(tmp_path):
    """A fresh machine (empty HOME, the default cache under the working directory, no tiny model built yet):
    the dry run lists the runs and leaves the file system as it found it."""
    work = tmp_path / "work"
    (work / "home").mkdir(parents=True)
    sweep = work / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "dry", "base": str(REPO / "recipes" / "quickstart.yaml"),
                                     "overrides": ["run.steps=2"], "seeds": [0, 1],
                                     "variants": {"a": [], "b": ["optim.lr=0.0002"]}}))
    before = _tree(work)
    env = {k: v for k, v in os.environ.items() if k not in ("CREDO_CACHE", "MPLCONFIGDIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(work / "home"), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "credo.cli", "ablate", str(sweep), "--dry-run"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "2 variants x 2 seeds = 4 runs, 0 finished, 4 to run" in p.stdout
    assert _tree(work) == before  # no .cache/credo/models (the tiny model), no runs/, no results, no font cache


def _parser() -> argparse.ArgumentParser:
    """The parser `credo` builds, caught at its parse_args or parse_known_args (which cli.main calls, to word an
    unknown option itself)."""
    caught = {}

    def catch(self, args=None, namespace=None):
        caught["parser"] = self
        raise SystemExit(0)

    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    for name in originals:
        setattr(argparse.ArgumentParser, name, catch)
    try:
        with pytest.raises(SystemExit):
            cli.main(["list"])
    finally:
        for name, fn in originals.items():
            setattr(argparse.ArgumentParser, name, fn)
    return caught["parser"]


def test_every_flag_of_every_subcommand_has_help():
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    described = {a.dest for a in subs._choices_actions if a.help}
    assert set(subs.choices) == described, f"subcommands without help: {set(subs.choices) - described}"
    assert {"run", "check", "ablate", "report", "bon", "list", "export"} <= set(subs.choices)
    missing = []
    for name, sub in [("credo", parser)] + sorted(subs.choices.items()):
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"arguments without help text: {missing}"
