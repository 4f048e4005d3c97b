"""A `Summary` (credo.ablate.report) as markdown and CSV: the tables of `credo ablate` and `credo report`.

The markdown (`render_markdown`):

- a provenance line: the warm-up design (whether warm-up variance is inside the intervals), the commits,
  hosts and dates of the runs, and their wall time;
- an overview: a row per variant, per metric mean ± sample standard deviation over seeds;
- per metric, each variant's n, mean with its 95% Student-t interval and, with a baseline, Δ (its mean minus
  the baseline's) with its 95% interval, the test (paired or Welch), the raw and the Holm-adjusted p over the
  table's comparisons, the effect size with its 95% interval (g_av for a paired row, Hedges' g for a Welch
  row; the cell names which), and the verdict, which uses the adjusted p;
- the comparisons named in advance, on the first metric, Holm-adjusted together.

`table.csv` holds the same numbers: per variant `n` and `exploratory` (how many of its runs were started with
`credo ablate --exploratory`), then per metric the columns `<label> mean`, `std`, `n`, `ci95 low`,
`ci95 high` and, with a baseline, `diff`, `diff ci95 low`, `diff ci95 high`, `test`, `p`, `p holm`,
`g kind` (g_av or g), `g`, `g ci95 low`, `g ci95 high`, `verdict`.
"""

from __future__ import annotations

import csv
import io
import math
import statistics

from credo.ablate.report import CONFIDENCE, Compared, Summary, warmup_design

CSV_STAT_COLUMNS = ("mean", "std", "n", "ci95 low", "ci95 high")
CSV_DIFF_COLUMNS = ("diff", "diff ci95 low", "diff ci95 high", "test", "p", "p holm", "g kind", "g", "g ci95 low",
                    "g ci95 high", "verdict")
EFFECT_HEAD = "effect size [{pct} CI]"


def fmt(x: float | None, sign: bool = False) -> str:
    if x is None or math.isnan(x):
        return "—"
    if math.isinf(x):
        return ("+" if sign and x > 0 else "") + ("∞" if x > 0 else "−∞")
    text = f"{x:.3f}" if x == 0 or 0.01 <= abs(x) < 1000 else f"{x:.3g}"
    return f"+{text}" if sign and x > 0 else text


def fmt_p(p: float) -> str:
    if math.isnan(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def interval(low: float, high: float, sign: bool = False) -> str:
    return "—" if math.isnan(low) else f"[{fmt(low, sign)}, {fmt(high, sign)}]"


def fmt_g(c: Compared) -> str:
    """'g_av +2.7 [+0.9, +4.4]' (paired) or 'g +3.1 [+1.2, +4.9]' (Welch): the kind named in the cell."""
    g = c.g
    if math.isnan(g.g):
        return "—"
    if math.isinf(g.g):
        return f"{g.kind} {fmt(g.g, sign=True)}"
    if math.isnan(g.low):
        return f"{g.kind} {g.g:+.1f}"
    return f"{g.kind} {g.g:+.1f} [{g.low:+.1f}, {g.high:+.1f}]"


def _mean_std(s) -> str:
    return fmt(s.mean) if math.isnan(s.std) else f"{fmt(s.mean)} ± {fmt(s.std)}"


def provenance(summary: Summary) -> list[str]:
    """Warm-up design, commits, hosts, dates and wall time of the runs behind a table."""
    recs = summary.records
    if not recs:
        return ["No finished runs."]
    commits = sorted({r.get("commit", "unknown") for r in recs})
    hosts = sorted({"{cpu} ({cpu_capability}), torch {torch}, {threads} thread(s) a run".format(
        **{k: h.get(k, "?") for k in ("cpu", "cpu_capability", "torch", "threads")}) for h in (r.get("host") or {} for r in recs)})
    dates = sorted(r["date"][:10] for r in recs if r.get("date"))
    walls = [r["wall_s"] for r in recs if isinstance(r.get("wall_s"), (int, float))]
    when = f"{dates[0]}" + (f" to {dates[-1]}" if dates and dates[-1] != dates[0] else "") if dates else "date unknown"
    wall = (f"; run wall time median {statistics.median(walls) / 60:.1f} min, total {sum(walls) / 60:.0f} min"
            if walls else "")
    return [warmup_design(recs), "",
            f"{len(recs)} runs, {when}, commit {', '.join(commits)}; host {'; '.join(hosts)}{wall}."] + exploratory_line(summary)


def _overview(summary: Summary) -> list[str]:
    labels = [m.label for m in summary.metrics]
    lines = ["| variant | n | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
    for res in summary.variants:
        cells = [_mean_std(res.stats[lab]) + (f" (n={res.stats[lab].n})" if res.stats[lab].n != res.n else "")
                 for lab in labels]
        lines.append(f"| {res.variant} | {res.n} | " + " | ".join(cells) + " |")
    return lines + ["", "Mean ± sample standard deviation over seeds; n = finished seeds."]


def _metric_table(summary: Summary, label: str) -> list[str]:
    pct = f"{CONFIDENCE:.0%}"
    head = ["variant", "n", "mean ± std", f"{pct} CI"]
    if summary.baseline:
        head += [f"Δ vs {summary.baseline} [{pct} CI]", "test", "p", "p (Holm)", EFFECT_HEAD.format(pct=pct), "verdict"]
    lines = [f"**{label}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in summary.variants:
        s = res.stats[label]
        cells = [res.variant, str(s.n), _mean_std(s), interval(s.low, s.high)]
        if summary.baseline:
            c = summary.vs_baseline[label].get(res.variant)
            cells += (["baseline", "", "", "", "", ""] if c is None else
                      [f"{fmt(c.diff, sign=True)} {interval(c.low, c.high, sign=True)}", c.test, fmt_p(c.p),
                       fmt_p(c.p_holm), fmt_g(c), c.verdict])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _named_table(summary: Summary) -> list[str]:
    pct = f"{CONFIDENCE:.0%}"
    git = any(c.named_before for c in summary.named)
    lines = [f"**Comparisons named: {summary.metrics[0].label}**", "",
             f"| comparison | Δ [{pct} CI] | test | p | p (Holm, {len(summary.named)}) | {EFFECT_HEAD.format(pct=pct)} | verdict |"
             + (" named before the run |" if git else ""), "|---|---|---|---|---|---|---|" + ("---|" if git else "")]
    for c in summary.named:
        lines.append(f"| {c.a} {c.expect} {c.b} | {fmt(c.diff, sign=True)} {interval(c.low, c.high, sign=True)} | "
                     f"{c.test} | {fmt_p(c.p)} | {fmt_p(c.p_holm)} | {fmt_g(c)} | {c.verdict} |"
                     + (f" {c.named_before or 'unknown'} |" if git else ""))
    if git:
        lines += ["", NAMED_NOTE]
    return lines + [""]


NAMED_NOTE = ("Named before the run: from git (credo.ablate.prereg), yes when a commit naming the comparison (in the "
              "sweep file, or in the `--compare` of this page's block) precedes every run of its two variants; a "
              "comparison that was not is exploratory, its verdict a lead for a new sweep, not a result.")


def exploratory_line(summary: Summary) -> list[str]:
    """A warning line when some runs were started with `credo ablate --exploratory`."""
    n = sum(bool(r.get("exploratory")) for r in summary.records)
    if not n:
        return []
    return ["", f"**Exploratory:** {n} of {len(summary.records)} runs were started with `credo ablate --exploratory` "
                "(the sweep file was not committed), so no comparison of this table was named before them."]


METHOD_NOTE = (
    "{pct} CI: Student-t interval of the mean over seeds. Δ: the variant's mean minus the baseline's (a named "
    "comparison: the first variant's minus the second's), with its {pct} interval and two-sided p from the paired "
    "t-test when both ran the same seeds and each seed's two runs started from one warm-up, else from Welch's "
    "test. p (Holm): adjusted by Holm-Bonferroni over the comparisons of that table. Effect size: Δ in standard "
    "deviations of the seeds, bias-corrected: g_av for a paired row (Δ over the root mean of the two variants' "
    "variances, corrected with n - 1 degrees of freedom; approximate noncentral-t interval, Algina & Keselman "
    "2003), Hedges' g for a Welch row (Δ over the pooled standard deviation; noncentral-t interval). Verdict: the direction "
    "when the adjusted p < 0.05, else not shown; for a named comparison, as named or reversed.")


def render_markdown(summary: Summary, *, overview: bool = True, notes: bool = True) -> str:
    """The tables of a summary as markdown (format in this module's docstring)."""
    lines = provenance(summary) + [""]
    if overview:
        lines += _overview(summary) + [""]
    for m in summary.metrics:
        lines += _metric_table(summary, m.label)
    if summary.named:
        lines += _named_table(summary)
    if notes:
        lines += [METHOD_NOTE.format(pct=f"{CONFIDENCE:.0%}"), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _cell(x) -> object:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else x


def render_csv(summary: Summary) -> str:
    labels = [m.label for m in summary.metrics]
    parts = CSV_STAT_COLUMNS + (CSV_DIFF_COLUMNS if summary.baseline else ())
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "n", "exploratory"] + [f"{lab} {part}" for lab in labels for part in parts])
    for res in summary.variants:
        exploratory = sum(bool(r.get("exploratory")) for r in summary.records if r["variant"] == res.variant)
        row = [res.variant, res.n, exploratory]
        for lab in labels:
            s = res.stats[lab]
            row += [s.mean, s.std, s.n, s.low, s.high]
            if summary.baseline:
                c = summary.vs_baseline[lab].get(res.variant)
                row += ([None] * len(CSV_DIFF_COLUMNS) if c is None else
                        [c.diff, c.low, c.high, c.test, c.p, c.p_holm, c.g.kind, c.g.g, c.g.low, c.g.high, c.verdict])
        w.writerow([_cell(x) for x in row])
    return buf.getvalue()
