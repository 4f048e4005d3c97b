"""One loader for every results file (issue 57, B.6): the flat lines of docs/results/staleness_lr*.jsonl and the
arm/metrics lines of docs/results/shop_sft_vs_rl.jsonl are read by `read_results` and reported by `credo report`;
the numbers are checked against the raw JSON read here by hand."""

import json
import statistics
from pathlib import Path

import pytest

from credo.ablate import report_cli
from credo.ablate.report import summarize_records
from credo.ablate.report_cli import parse_metric
from credo.ablate.results import read_results

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"


def raw(name):
    return [json.loads(l) for l in (RESULTS / name).read_text().splitlines() if l.strip()]


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS.glob("*.jsonl")
                                        if p.name.startswith(("staleness_lr", "shop_sft_vs_rl"))))
def test_every_legacy_line_is_read_and_keeps_every_number(name):
    lines, recs = raw(name), read_results(RESULTS / name)
    assert len(recs) == len(lines)
    for line, rec in zip(lines, recs):
        assert {k: rec[k] for k in line} == line  # the old keys untouched; the schema-1 keys added beside them
        assert {"sweep", "variant", "seed", "final", "curves"} <= rec.keys()


@pytest.mark.parametrize("name", ["staleness_lr.jsonl", "staleness_lr_2026-12-03.jsonl"])
def test_flat_staleness_lines_report_their_own_numbers(name):
    lines, recs = raw(name), read_results(RESULTS / name)
    metrics = [parse_metric("eval/accuracy:final"), parse_metric("eval/accuracy:best")]
    s = summarize_records(recs, metrics)
    for v in s.variants:
        mine = [l for l in lines if l["variant"] == v.variant]
        assert v.stats["eval/accuracy final"].mean == pytest.approx(statistics.fmean(l["eval/accuracy_final"] for l in mine))
        assert v.stats["eval/accuracy best"].mean == pytest.approx(statistics.fmean(l["eval/accuracy_best"] for l in mine))
        assert all(r["values"]["train/reward_mean last-5 mean"] == l["train/reward_mean_last5"]
                   for r, l in zip([r for r in recs if r["variant"] == v.variant], mine))


def test_shop_arm_lines_report_per_arm(capsys):
    lines = raw("shop_sft_vs_rl.jsonl")
    code = report_cli.report_main(report_cli._parser().parse_args(
        [str(RESULTS / "shop_sft_vs_rl.jsonl"), "--metric", "eval/return:final", "--metric", "shop/success:final",
         "--baseline", "sft"]))
    out = capsys.readouterr()
    assert code == 0, out.err
    for arm in ("sft", "rl", "ipa"):
        mean = statistics.fmean(l["metrics"]["eval/return"] for l in lines if l["arm"] == arm)
        std = statistics.stdev(l["metrics"]["eval/return"] for l in lines if l["arm"] == arm)
        assert f"| {arm} | 5 | {mean:.3f} ± {std:.3f} |" in out.out
