"""Every link and file path in README.md and docs/*.md resolves inside the repository.

Two kinds of reference are checked:
- markdown links `[text](target)` that are not URLs: the target must exist relative to the page;
- file paths written as code (`credo/envs/mastermind.py`, `shared/notes/envs.md`): a path with a `/` and a
  file extension must exist relative to the repository root or to the page. Exempt are paths in a run
  folder (`runs/...`, written by a run, not shipped) and files of third-party packages (`vllm/config/model.py`),
  and paths with placeholders (`<name>`, `*`, `{...}`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
FILE_EXT = re.compile(r"\.(py|md|yaml|yml|txt|toml|json|jsonl|png|sh|cfg|ipynb)$")
THIRD_PARTY = {"vllm", "verl", "trl", "transformers", "torch", "deepspeed", "gem", "ray", "datasets", "peft"}


def broken_references(page: Path, root: Path = ROOT) -> list[str]:
    """The link targets and code paths of `page` that name no file or folder of the repository at `root`."""
    text = page.read_text()
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # an anchor, or http:, mailto:, ...
            continue
        resolved = (page.parent / target).resolve()
        if not resolved.exists() or root not in (resolved, *resolved.parents):
            bad.append(f"link ({target})")
    for m in CODE.finditer(text):
        path = m.group(1)
        if "/" not in path or not FILE_EXT.search(path) or re.search(r"[<>*{}$=:]", path):
            continue
        first = path.lstrip("./").split("/")[0]
        if first == "runs" or first in THIRD_PARTY:
            continue
        found = [p for p in (root / path, page.parent / path) if p.exists() and root in p.resolve().parents]
        if not found:
            bad.append(f"path `{path}`")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_resolves_inside_the_repository(page):
    assert broken_references(page) == [], f"{page.relative_to(ROOT)} refers to files outside the repository"


def test_the_checker_finds_a_broken_link_and_an_outside_path(tmp_path):
    (tmp_path / "credo").mkdir()
    (tmp_path / "credo" / "trainer.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[ok](other.md) [bad](missing.md) [up](../../outside.md) [anchor](#x) [web](https://a.b/c.md) "
                    "`credo/trainer.py` `shared/notes/envs.md` `runs/x/table.md` `vllm/config/model.py` `runs/<n>/a.md`\n")
    assert broken_references(page, tmp_path.resolve()) == [
        "link (missing.md)", "link (../../outside.md)", "path `shared/notes/envs.md`"]
