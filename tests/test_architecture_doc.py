"""docs/architecture.md states what the code is: every module path and dotted name it names exists, and its
capability table is the one in credo/capabilities.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def _exists_dotted(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_path_the_page_names_exists():
    paths = set(re.findall(r"(?<![\w/.])((?:credo|tests|benchmarks|docs|recipes)/[\w/.]*\w)", PAGE))
    assert len(paths) > 20
    missing = sorted(p for p in paths - {"credo/envs"} if not (ROOT / p).exists())  # a moved-from folder
    assert not missing, missing


def test_every_dotted_name_the_page_names_exists():
    names = set(re.findall(r"`(credo(?:\.\w+)+)", PAGE)) - {"credo.train.critic", "credo.envs", "credo.rewards.judge",
                                                             "credo.train.tail_batching"}  # the moved paths' examples
    assert len(names) > 10
    missing = sorted(n for n in names if not _exists_dotted(n))
    assert not missing, missing


def test_the_capability_table_is_the_code():
    from credo.capabilities import BACKENDS

    for name, provided in BACKENDS.items():
        row = re.search(rf"^\| backend `{name}`[^|]*\| ([^|]*) \|$", PAGE, re.M)
        assert row, name
        assert {c.strip() for c in row.group(1).split(",")} == set(provided), name
