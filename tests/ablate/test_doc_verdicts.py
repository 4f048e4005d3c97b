"""The docs' verdicts are no stronger than the intervals `credo report` makes from the committed results (issue
57, B.3), and the family pages' prose intervals are the tables' (B.5): each sentence is checked against numbers
computed here from docs/results/, not against a copy of itself."""

from pathlib import Path

import pytest

from credo.ablate import report_cli
from credo.ablate.report_cli import doc_blocks, prose_intervals_unmatched, prose_marked, report_pages
from credo.ablate.tables import fmt, fmt_p, interval

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def summary(argv: str):
    return report_cli.summarize_request(report_cli._request(report_cli._parser().parse_args(argv.split())))


def page(name: str) -> str:
    return (REPO / "docs" / name).read_text()


def paragraph(text: str, start: str) -> str:
    """The markdown paragraph or list item that begins with `start`."""
    i = text.index(start)
    ends = [j for j in (text.find("\n- ", i + 1), text.find("\n\n", i)) if j != -1]
    return " ".join(text[i:min(ends, default=len(text))].split())


def test_pgenrm_against_no_scaling_is_not_shown_over_the_tables_four_rows():
    s = summary("docs/results/pgenrm_scaling.jsonl --metric pgenrm/per_user_accuracy --baseline none "
                "--variants none ind ind_more ind_pro pro")
    row = s.vs_baseline["pgenrm/per_user_accuracy final"]["ind_pro"]
    assert row.verdict == "not shown" and fmt_p(row.p_holm) == "0.146"
    repro = paragraph(page("reproductions.md"), "- **Ind-8 + Pro-4 against no scaling")
    assert "not shown" in repro and f"Holm p {fmt_p(row.p_holm)} over the four rows" in repro
    assert "beats no scaling" not in page("reproductions.md")
    judges = paragraph(page("judges.md"), "The same command at commit 3d9e08a now also writes `docs/results/pgenrm")
    assert f"Holm p {fmt_p(row.p_holm)}" in judges and "no scaling by" not in judges


def test_palette_steer_accuracy_is_not_called_worse():
    s = summary("recipes/ablations/palette_steer.yaml")
    final = s.vs_baseline["eval/accuracy final"]["palette"]
    assert final.verdict == "not shown"
    text = page("reproductions.md")
    assert "Accuracy is worse with palette" not in text
    item = paragraph(text, "- **Lower accuracy with palette is not shown**")
    assert f"{fmt(final.diff, sign=True)} {interval(final.low, final.high, sign=True)}" in item


def test_tricks_or_traps_chosen_column_is_corrected_over_the_six_tables():
    s = summary("recipes/ablations/tricks_or_traps.yaml")
    bundle = s.vs_baseline["eval/accuracy last-3 mean"]["dapo"]
    corrected = min(1.0, bundle.p_holm * len(s.metrics))  # the column picked after the results, among six
    assert len(s.metrics) == 6 and round(corrected, 2) == pytest.approx(0.15, abs=0.01)
    text = page("reproductions.md")
    assert "shown for the bundle on the smoother" not in text
    item = paragraph(text, "- **The DAPO-style bundle is below group normalisation")
    assert "corrected over the six" in item and "about 0.15" in item and "**not shown" in item


def test_tail_batching_states_the_loss_its_interval_allows():
    s = summary("recipes/ablations/tail_batching.yaml --metric eval/accuracy:final")
    row = s.vs_baseline["eval/accuracy final"]["tail_batching"]
    assert row.test == "paired" and row.low < 0 < row.high
    text = page("tail_batching.md")
    assert "**No accuracy loss from tail batching" not in text
    assert f"a loss of up to {fmt(-row.low)} is not excluded" in text
    assert f"a loss of up to {fmt(-row.low)} not\nexcluded" in page("performance.md")


def test_async_staleness_scaling_sentence_admits_the_s8_help():
    s = summary("recipes/ablations/staleness_lr_scaling.yaml --metric eval/accuracy:final")
    c = next(c for c in s.named if "max_staleness=8,lr=0.000375" in c.a)
    helped = f"{-c.diff:+.3f} [{-c.high:+.3f}, {-c.low:+.3f}]"  # scaling on minus off, to 3 decimals as printed
    assert c.verdict == "reversed" and helped == "+0.078 [+0.001, +0.155]"
    item = paragraph(page("async.md"), "- `optim.staleness_lr_scaling` (lr = optim.lr / S past S_ref = 1)")
    assert "buys nothing" not in item and helped in item


FAMILY = ["polymath.md", "palette.md", "tail_batching.md"]


@pytest.mark.parametrize("name", FAMILY)
def test_family_pages_print_their_prose_intervals_from_their_tables(name):
    text = page(name)
    assert prose_marked(text) and doc_blocks(text)
    assert prose_intervals_unmatched(text) == []
    assert REPO / "docs" / name in [p.resolve() for p in report_pages(REPO / "docs")]


def test_a_welch_interval_in_prose_is_caught():
    """polymath.md's first text printed the Welch Δ of a paired design; beside the paired table it is flagged."""
    block = ("<!-- credo report x -->\n| v | 5 | -0.030 ± 0.004 | [-0.035, -0.024] | -0.025 [-0.042, -0.00735] | "
             "paired |\n<!-- /credo report -->\n")
    welch = block + "mean -0.030 [-0.035, -0.024] (Δ -0.025 [-0.038, -0.011])\n"
    paired = block + "mean -0.030 [-0.035, -0.024] (Δ -0.025 [-0.042, -0.00735])\n"
    assert prose_intervals_unmatched(welch) == ["-0.025 [-0.038, -0.011]"]
    assert prose_intervals_unmatched(paired) == []
    assert prose_intervals_unmatched("```\n-1.0 [-2.0, 0.5]\n```\n") == []  # a code fence is not prose
    assert not prose_marked("a page may name `<!-- credo report: prose intervals -->` in a sentence\n")


def test_tail_batching_table_file_is_a_report_block():
    """docs/results/tail_batching_table.md named a commit (90113a9) that no run carries; it is now remade."""
    text = (REPO / "docs/results/tail_batching_table.md").read_text()
    (argv, body), = doc_blocks(text)
    assert "90113a9+dirty" not in body and "commit 29b97d0" in body
