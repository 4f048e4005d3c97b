"""benchmarks/legacy_table_stats.py: the restated statistics of the tables that kept no per-seed values.

Its one step that is not `credo.ablate.stats` is getting a group's variance back from a printed Student-t
interval; checked here against scipy on the raw values the interval came from, and against the p-values the
page printed (computed at the time from the raw values), which also catches a mistyped row."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from credo.ablate.stats import mean_ci, welch_from_moments

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("legacy_table_stats", REPO / "benchmarks" / "legacy_table_stats.py")
legacy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(legacy)
SPECS = yaml.safe_load((REPO / "docs" / "results" / "legacy_summaries.yaml").read_text())


def test_variance_from_an_interval_gives_scipys_welch_test():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_a, n_b = rng.integers(2, 9, size=2)
        a, b = rng.normal(0.5, rng.uniform(0.01, 0.1), n_a), rng.normal(0.52, rng.uniform(0.01, 0.1), n_b)
        ca, cb = mean_ci(list(a)), mean_ci(list(b))
        assert ca.n == n_a
        w = welch_from_moments(*legacy.moments([ca.mean, ca.low, ca.high], int(n_a)),
                               *legacy.moments([cb.mean, cb.low, cb.high], int(n_b)))
        ref = sps.ttest_ind(a, b, equal_var=False)
        assert w.p == pytest.approx(ref.pvalue, rel=1e-9)
        assert w.t == pytest.approx(ref.statistic, rel=1e-9)


@pytest.mark.parametrize("name", [k for k, v in SPECS.items() if "printed_p" in v])
def test_restated_p_lands_near_the_p_printed_from_raw_values(name):
    spec = SPECS[name]
    base, n = spec["baseline"], spec["n"]
    for variant, printed in spec["printed_p"].items():
        p = welch_from_moments(*legacy.moments(spec["variants"][variant], n),
                               *legacy.moments(spec["variants"][base], n)).p
        if isinstance(printed, str):
            assert p < float(printed.lstrip("<")), (name, variant)
        else:  # the printed means and intervals are rounded to 3 digits, so only roughly
            assert abs(p - printed) < 0.1 and abs(math.log10(p) - math.log10(printed)) < 0.25, (name, variant, p)


HISTORY = REPO / "docs" / "reproductions-history.md"


@pytest.mark.parametrize("doc", legacy.DOCS, ids=lambda d: d.name)
def test_the_docs_blocks_are_the_scripts_output(doc):
    text, stale = legacy._rewrite(doc, SPECS)
    assert not stale, f"rerun `python benchmarks/legacy_table_stats.py --update {doc.relative_to(REPO)}`: {stale}"
    assert text == doc.read_text()


def test_every_transcribed_table_has_its_block_and_the_first_runs_are_on_the_history_page():
    names = {doc.name: [m["name"] for m in legacy.BLOCK_RE.finditer(doc.read_text())] for doc in legacy.DOCS}
    assert names[HISTORY.name], "no legacy stats block in docs/reproductions-history.md"
    found = [n for ns in names.values() for n in ns]
    assert sorted(found) == sorted(set(found)), f"a block appears twice: {found}"
    assert set(found) == set(SPECS), f"legacy_summaries.yaml and the pages' blocks differ: {set(SPECS) ^ set(found)}"


def test_the_check_fails_on_a_block_that_differs_from_the_script(tmp_path, capsys):
    text = HISTORY.read_text()
    m = legacy.BLOCK_RE.search(text)
    body = m["body"]
    changed = body.replace("| not shown |", "| shown |", 1) if "| not shown |" in body else body.replace("[", "[ ", 1)
    assert changed != body
    doc = tmp_path / "page.md"
    doc.write_text(text[:m.start("body")] + changed + text[m.end("body"):])
    assert legacy._rewrite(doc, SPECS)[1] == [m["name"]]
    assert legacy.main(["--check", str(doc)]) == 1
    assert m["name"] in capsys.readouterr().err
    assert legacy.main(["--update", str(doc)]) == 0
    assert legacy.main(["--check", str(doc)]) == 0 and doc.read_text() == legacy._rewrite(HISTORY, SPECS)[0]
