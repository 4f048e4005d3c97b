"""Every table in the docs that comes from a results file is what `credo report` makes from that file today.

A table sits between `<!-- credo report ARGS -->` and `<!-- /credo report -->`; this remakes each from its
command (paths relative to the repository root) and fails on any difference, naming the block and the first
line that differs. `credo report --update docs/reproductions.md` rewrites them."""

import difflib
import subprocess
from pathlib import Path

import pytest

from credo.ablate.report_cli import block_text, doc_blocks

REPO = Path(__file__).resolve().parents[2]
SHALLOW = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip() != "false"
"""A shallow clone (or no git) lacks the commits that say whether a comparison was named before its run
(credo.ablate.prereg): the tables' "named before the run" column then reads unknown."""
DOCS = sorted(p for p in (REPO / "docs").rglob("*.md") if "<!-- credo report " in p.read_text())
BLOCKS = [(doc, argv, body) for doc in DOCS for argv, body in doc_blocks(doc.read_text())]


def test_the_reproductions_page_has_report_tables():
    assert any(doc.name == "reproductions.md" for doc, _, _ in BLOCKS)


@pytest.mark.parametrize("doc,argv,body", BLOCKS, ids=[f"{d.name}:{a.split()[0]}:{i}" for i, (d, a, _) in enumerate(BLOCKS)])
def test_each_table_is_remade_from_its_results_file(doc, argv, body, monkeypatch):
    if SHALLOW and "named before the run" in body:
        pytest.skip("not a full git clone: the 'named before the run' column needs the history")
    monkeypatch.chdir(REPO)
    made = block_text(argv, doc.relative_to(REPO))
    diff = "\n".join(difflib.unified_diff(body.splitlines(), made.splitlines(), "in the doc", "from the results", lineterm=""))
    assert made == body, f"{doc.relative_to(REPO)}: `credo report {argv}` gives another table:\n{diff}"
