"""Issue 57 B.5: an interval quoted in a docs page's prose is tied to its comparison by a `credo:interval` marker
and `credo report --check` recomputes it from docs/results/ (credo.ablate.prose). The recomputation is checked
here against scipy's paired t-test written out directly, and an edited number must fail the check."""

from pathlib import Path

import pytest

from credo import cli
from credo.ablate.prose import check_page, recompute
from credo.ablate.report_cli import INTERVAL_RE, _unmarked_prose, prose_intervals_unmatched
from credo.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
PAGES = {"polymath.md": 6, "palette.md": 4, "tail_batching.md": 1, "distill.md": 6, "async.md": 12, "moe.md": 1, "gateway.md": 6}
DISTILL = 'recipes/ablations/distill.yaml compare="distill > grpo" metric=eval/accuracy:auc test=paired'


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_marked_interval_of_the_family_pages_is_its_recomputation(name):
    marked = check_page((REPO / "docs" / name).read_text())
    assert len(marked) == PAGES[name]
    assert [m for m in marked if m.problem] == []


@pytest.mark.parametrize("name", sorted(PAGES))
def test_an_edited_interval_fails(name):
    """Each marked interval's last printed digit moved by one (two where one is within the printed rounding)."""
    text, cache = (REPO / "docs" / name).read_text(), {}
    for m in check_page(text, cache):
        low = m.printed.split("[")[1].split(",")[0]
        step = 10 ** -len(low.split(".")[1])
        wrong_low = f"{float(low.replace('−', '-')) - 2 * step:.{len(low.split('.')[1])}f}"
        if low.startswith("+") and not wrong_low.startswith("-"):
            wrong_low = "+" + wrong_low
        end = m.offset + len(m.printed)
        assert text[m.offset:end] == m.printed
        edited = text[:m.offset] + m.printed.replace(f"[{low},", f"[{wrong_low},", 1) + text[end:]
        problems = [x.problem for x in check_page(edited, cache) if x.line == m.line and x.spec == m.spec]
        assert problems and problems[0].startswith(f"printed {m.printed.split(' [')[0]} [{wrong_low},"), (m, problems)


def test_the_recomputation_is_a_paired_t_interval():
    """distill > grpo on the curve's mean level, from the raw results with scipy (not credo.ablate.stats)."""
    import json

    import numpy as np
    from scipy import stats

    lines = [json.loads(x) for x in (REPO / "docs/results/distill.jsonl").read_text().splitlines() if x.strip()]

    def auc(rec):  # the mean of the eval curve over its logged steps (trapezoid over step / span)
        steps, vals = zip(*sorted((int(s), v) for s, v in rec["curves"]["eval/accuracy"].items()))
        return np.trapezoid(vals, steps) / (steps[-1] - steps[0])

    by = {(r["variant"], r["seed"]): auc(r) for r in lines if r.get("sweep") == "distill"}
    seeds = sorted(s for v, s in by if v == "grpo")
    d = np.array([by["distill", s] - by["grpo", s] for s in seeds])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    (est, low, high), test = recompute(DISTILL, {})
    assert test == "paired"
    assert np.allclose([est, low, high], [d.mean(), d.mean() - half, d.mean() + half], atol=1e-9)


def test_the_printed_precision_is_the_tolerance():
    (est, low, _), _ = recompute('recipes/ablations/staleness_lr_scaling.yaml compare="max_staleness=8,lr=0.000375,'
                                 'staleness_lr_scaling=true vs max_staleness=8,lr=0.000375,staleness_lr_scaling=false" '
                                 "test=paired", {})
    assert round(low, 3) == 0.001 and round(low, 5) != 0.001  # +0.001 as printed stands for 0.000882...

    def page(low_text):
        return ('S = 8, paired: <!-- credo:interval recipes/ablations/staleness_lr_scaling.yaml compare="max_staleness=8,'
                'lr=0.000375,staleness_lr_scaling=true vs max_staleness=8,lr=0.000375,staleness_lr_scaling=false" '
                f"test=paired -->+0.078 [{low_text}, +0.155]\n")

    assert [m.problem for m in check_page(page("+0.001"))] == [""]
    assert [m.problem for m in check_page(page(f"+{low:.5f}"))] == [""]
    assert check_page(page("+0.002"))[0].problem.startswith("printed +0.078 [+0.002, +0.155], recomputed +0.078")
    assert check_page(page("+0.00089"))[0].problem  # five decimals: 0.00088, not 0.00089


def test_the_label_must_be_the_tables_test_and_be_printed():
    ok = f"a paired difference <!-- credo:interval {DISTILL} -->+0.016 [+0.011, +0.020]\n"
    assert [m.problem for m in check_page(ok)] == [""]
    welch = ok.replace("test=paired", "test=Welch").replace("a paired", "a Welch")
    assert check_page(welch)[0].problem == "the tables' test is paired, the marker says test=Welch"
    unlabelled = ok.replace("a paired difference", "a difference")
    assert check_page(unlabelled)[0].problem == "the paragraph does not say the interval is paired"
    assert check_page(f"paired <!-- credo:interval {DISTILL} --> (no number)\n")[0].problem.startswith("no 'EST")
    assert check_page(f"```\n<!-- credo:interval {DISTILL} -->+9.0 [+1.0, +2.0]\n```\n") == []  # an example


@pytest.mark.parametrize("spec,words", [
    ('recipes/ablations/distill.yaml compare="distill > grpo"', "test=paired or test=Welch"),
    ('recipes/ablations/distill.yaml compare="distill > nobody" test=paired', "'nobody' names no variant"),
    ('recipes/ablations/distill.yaml variant=distill colour=red', "unknown keys ['colour']"),
    ("docs/results/nope.jsonl variant=distill", "results file not found"),
])
def test_a_marker_that_cannot_be_read_is_a_config_error(spec, words):
    with pytest.raises(ConfigError, match="credo:interval at line 1") as e:
        check_page(f"paired <!-- credo:interval {spec} -->+0.1 [+0.0, +0.2]\n")
    assert words in str(e.value)


def test_marked_intervals_leave_the_verbatim_check_and_the_unchecked_count():
    text = f"<!-- credo report: prose intervals -->\n\npaired <!-- credo:interval {DISTILL} -->+0.016 [+0.011, +0.020]\n"
    assert prose_intervals_unmatched(text) == [] and INTERVAL_RE.findall(_unmarked_prose(text)) == []
    assert prose_intervals_unmatched(text + "and -1.0 [-2.0, 0.5]\n") == ["-1.0 [-2.0, 0.5]"]


def test_credo_report_check_fails_on_an_edited_prose_interval(tmp_path, capsys):
    good = tmp_path / "page.md"
    good.write_text(f"# A page\n\nDistillation, paired: <!-- credo:interval {DISTILL} -->+0.016 [+0.011, +0.020].\n")
    assert cli.main(["report", "--check", str(good)]) == 0
    assert "1/1 marked intervals" in capsys.readouterr().out
    good.write_text(good.read_text().replace("+0.020]", "+0.021]"))
    assert cli.main(["report", "--check", str(good)]) == 1
    err = capsys.readouterr().err
    assert f"{good}:3: credo:interval {DISTILL}: printed +0.016 [+0.011, +0.021], recomputed +0.016 [+0.011, +0.020]" in err
    good.write_text(good.read_text().replace("test=paired", "tset=paired"))
    assert cli.main(["report", "--check", str(good)]) == 2
    assert capsys.readouterr().err.startswith("credo: config error: credo:interval at line 3")


# --- every interval of every page: stat=g, unpaired=true, credo:quoted, quoted regions, the historical mark ---

def _distill_final():
    """distill and grpo's final eval accuracy per seed, read from the raw file (not through credo.ablate)."""
    import json

    lines = [json.loads(x) for x in (REPO / "docs/results/distill.jsonl").read_text().splitlines() if x.strip()]
    last = {}
    for r in lines:
        if r.get("sweep") == "distill":
            curve = r["curves"]["eval/accuracy"]
            last[r["variant"], r["seed"]] = curve[max(curve, key=int)]
    seeds = sorted(s for v, s in last if v == "grpo")
    return [last["distill", s] for s in seeds], [last["grpo", s] for s in seeds]


def test_stat_g_is_the_paired_g_av_and_the_paragraph_must_name_it():
    import numpy as np
    from scipy import special

    a, b = (np.array(x) for x in _distill_final())
    n = len(a)
    j = special.gamma((n - 1) / 2) / (np.sqrt((n - 1) / 2) * special.gamma((n - 2) / 2))  # exact Hedges J(n - 1)
    g_av = j * (a.mean() - b.mean()) / np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    spec = 'recipes/ablations/distill.yaml compare="distill > grpo" test=paired stat=g'
    (g, low, high), test = recompute(spec, {})
    assert test == "paired" and abs(g - g_av) < 1e-9 and low < g < high
    text = f"paired, g_av <!-- credo:interval {spec} -->{g:+.2f} [{low:+.2f}, {high:+.2f}]\n"
    assert [m.problem for m in check_page(text)] == [""]
    assert check_page(text.replace("g_av", "g"))[0].problem == "the paragraph does not say the effect size is g_av"
    assert check_page(text.replace(f"{g:+.2f} [", f"{g + 0.05:+.2f} ["))[0].problem.startswith("printed")


def test_unpaired_is_welchs_interval_whatever_the_tables_design():
    import numpy as np
    from scipy import stats

    a, b = (np.array(x) for x in _distill_final())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    spec = 'recipes/ablations/distill.yaml compare="distill > grpo" test=Welch unpaired=true'
    (est, low, high), test = recompute(spec, {})
    assert test == "Welch" and np.allclose([est, low, high], [a.mean() - b.mean(), a.mean() - b.mean() - half,
                                                             a.mean() - b.mean() + half], atol=1e-9)
    paired, _ = recompute(spec.replace(" test=Welch unpaired=true", " test=paired"), {})
    assert paired[1] != low  # the tables pair these runs: unpaired=true is what makes it Welch
    with pytest.raises(ConfigError, match="unpaired=true goes with compare= and test=Welch"):
        recompute(spec.replace("test=Welch", "test=paired"), {})


def _page(tmp_path, body: str) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    page = docs / "page.md"
    page.write_text(f"# A page\n\n{body}\n")
    return page


def test_a_quoted_interval_is_counted_by_kind_and_must_hold_an_interval(tmp_path, capsys):
    page = _page(tmp_path, "The paper: <!-- credo:quoted paper: Table 2 of arXiv 2508.08221 -->+0.8 [+0.3, +1.3];\n"
                           "timed <!-- credo:quoted timing: median of 3 runs [min, max] -->1.77 [1.50,\n1.79] s.")
    assert cli.main(["report", "--check", str(page)]) == 0
    assert f"2 intervals of {page} quoted, not recomputed (paper 1, timing 1)" in capsys.readouterr().out
    assert INTERVAL_RE.findall(_unmarked_prose(page.read_text())) == []
    page.write_text(page.read_text().replace("-->1.77 [1.50,\n1.79] s.", "--> (lost)"))
    assert cli.main(["report", "--check", str(page)]) == 1
    assert "credo:quoted timing: no interval follows the marker" in capsys.readouterr().err
    page.write_text("<!-- credo:quoted guess: because -->+0.8 [+0.3, +1.3]\n")
    assert cli.main(["report", "--check", str(page)]) == 2
    assert "KIND one of paper, timing, legacy, setting, script" in capsys.readouterr().err


def test_a_quoted_region_counts_every_interval_inside_and_must_be_closed_and_hold_one(tmp_path, monkeypatch, capsys):
    table = "| a | 0.444 [0.422, 0.466] | +0.401 [0.382,\n0.419] |\n"
    page = _page(tmp_path, f"<!-- credo:quoted-begin legacy: first run, values not kept -->\n{table}"
                           "<!-- credo:quoted-end -->\n\nAfter it: 0.1 [0.0, 0.2].")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "--check"]) == 1  # the unmarked one after the region fails the whole check
    out, err = capsys.readouterr()
    assert "2 intervals of docs/page.md quoted, not recomputed (legacy 2)" in out  # a page with only a region counts
    assert "docs/page.md: 1 intervals in prose, not checked" in err
    assert INTERVAL_RE.findall(_unmarked_prose(page.read_text())) == ["0.1 [0.0, 0.2]"]  # outside: still unmarked
    page.write_text(page.read_text().replace("<!-- credo:quoted-end -->", ""))
    assert cli.main(["report", "--check", "docs/page.md"]) == 1
    assert "no '<!-- credo:quoted-end -->' closes it" in capsys.readouterr().err
    page.write_text("<!-- credo:quoted-begin legacy: x -->\nno numbers\n<!-- credo:quoted-end -->\n")
    assert cli.main(["report", "--check", "docs/page.md"]) == 1
    assert "no interval inside the region" in capsys.readouterr().err


def test_every_docs_page_checks_every_interval_and_a_new_one_is_reported(tmp_path, monkeypatch, capsys):
    from credo.ablate.report_cli import _list_unchecked

    assert _list_unchecked(REPO / "docs") == 0, capsys.readouterr().err  # the repository's pages: nothing unchecked
    out = capsys.readouterr().out
    assert "reproductions-history.md: " in out and "historical: not recomputed" in out
    page = _page(tmp_path, f"paired <!-- credo:interval {DISTILL} -->+0.016 [+0.011, +0.020], and later −0.008\n"
                           "[−0.045, +0.029] with none.")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    (tmp_path / "docs" / "results").symlink_to(REPO / "docs" / "results")
    assert cli.main(["report", "--check"]) == 1  # one wrapped, unmarked interval fails the whole check
    err = capsys.readouterr().err
    assert "docs/page.md: 1 intervals in prose, not checked" in err


def test_the_historical_mark_counts_its_page_and_is_refused_where_results_exist(tmp_path, monkeypatch, capsys):
    from credo.ablate.report_cli import HISTORY_MARK

    page = _page(tmp_path, f"{HISTORY_MARK}\n\nThe first run: 0.886 [0.875, 0.896] and +0.1 [+0.0, +0.2].")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "--check"]) == 0
    assert "docs/page.md: 2 intervals in prose, historical: not recomputed" in capsys.readouterr().out
    page.write_text(page.read_text() + "\nNow <!-- credo:quoted paper: p. 3 -->+0.5 [+0.1, +0.9].\n")
    assert cli.main(["report", "--check"]) == 1
    assert "its intervals have raw results; mark them instead" in capsys.readouterr().err


def test_a_wrapped_interval_after_a_marker_is_checked():
    text = f"paired <!-- credo:interval {DISTILL} -->+0.016\n[+0.011, +0.020]\n"
    assert [m.problem for m in check_page(text)] == [""]
    assert check_page(text.replace("+0.020]", "+0.021]"))[0].problem.startswith("printed +0.016 [+0.011, +0.021]")


def test_every_marked_interval_of_every_page_is_its_recomputation():
    """Every docs page's credo:interval markers (the family pages' are edited one by one above) and quoted markers."""
    from credo.ablate.prose import quoted_intervals

    cache, n = {}, 0
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text()
        marked = check_page(text, cache)
        assert [(m.line, m.problem) for m in marked if m.problem] == [], page
        assert quoted_intervals(text)[1] == [], page
        n += len(marked)
    assert n >= 198  # 198 on 2026-12-07: a page that loses its markers is caught here


@pytest.mark.parametrize("form", ["2.29x, 95% CI [1.89, 2.78]", "kill rate 95.0% [90.4%, 97.4%]", "3234 [3489, 2980]",
                                  "slope +0.08 with an interval [-0.05,\n+0.21]", "+0.016 [+0.011, +0.020]"])
def test_the_detector_sees_every_printed_form_and_a_quoted_marker_takes_it(form):
    assert len(INTERVAL_RE.findall(form)) == 1
    est, bracket = form.rsplit("[", 1)
    head, _, last = est.rstrip().rpartition(" ")
    quoted = f"{head} <!-- credo:quoted timing: t -->{last} [{bracket}" if head else f"<!-- credo:quoted timing: t -->{form}"
    assert INTERVAL_RE.findall(_unmarked_prose(quoted)) == [], quoted


@pytest.mark.parametrize("not_one", ["clamped to [-20, 20]", "shape [4, 7]", "`[0, 10]`", "in [0, 1], over"])
def test_the_detector_leaves_ranges_and_shapes_alone(not_one):
    assert INTERVAL_RE.findall(not_one) == []
