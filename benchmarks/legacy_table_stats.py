"""Holm-adjusted p and Hedges' g [95% CI] for the published tables that kept no per-seed values.

Those tables (the first runs, moved to docs/reproductions-history.md when the reruns under issue 33's protocol
replaced them in docs/reproductions.md) were run before issue 33 and printed, per variant, the mean and 95%
Student-t interval over n seeds (and often a Welch p). Their seeds' values are gone, so `credo report` cannot
remake them; but a mean, an interval and n give the sample variance back (s = half-width * sqrt(n) /
t(0.975, n - 1)), and with it Welch's test, Holm's adjustment over the table's comparisons and Hedges' g with
its interval, the same formulas as `credo.ablate.stats` uses on raw values. The figures are rounded to 3
digits, so the restated p are good to about one significant digit (the `p printed` column shows how far they
land from the p computed from the raw values at the time). A `d` table (only Cohen's d printed) gets g and its
interval from d and n.

    python benchmarks/legacy_table_stats.py                                          # every table, as markdown
    python benchmarks/legacy_table_stats.py --update docs/reproductions-history.md   # rewrite the legacy stats blocks
    python benchmarks/legacy_table_stats.py --check docs/reproductions-history.md    # exit 1 when a block differs
    python benchmarks/legacy_table_stats.py --check                                  # both pages (DOCS)

A block in the doc: `<!-- legacy stats NAME -->` ... `<!-- /legacy stats -->`, NAME a key of
docs/results/legacy_summaries.yaml (the printed numbers, transcribed).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import yaml

from credo.ablate.stats import hedges_g_from_moments, holm, t_quantile, welch_from_moments

SUMMARIES = Path(__file__).resolve().parents[1] / "docs" / "results" / "legacy_summaries.yaml"
# the pages that hold (or may hold) `<!-- legacy stats NAME -->` blocks; --update/--check without a page take these
DOCS = [Path(__file__).resolve().parents[1] / "docs" / name for name in ("reproductions-history.md", "reproductions.md")]
BLOCK_RE = re.compile(r"^<!-- legacy stats (?P<name>\S+) -->\n(?P<body>.*?)^<!-- /legacy stats -->$", re.M | re.S)


def moments(row: list[float], n: int) -> tuple[int, float, float]:
    """(n, mean, sample variance) from a printed [mean, low, high] Student-t interval over n seeds."""
    mean, low, high = row
    s = (high - low) / 2 * math.sqrt(n) / t_quantile(0.975, n - 1)
    return n, mean, s * s


def _p(p: float | str) -> str:
    if isinstance(p, str):  # printed as a bound, e.g. "<0.001"
        return p
    return "—" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _g(g) -> str:
    return f"{g.g:+.1f} [{g.low:+.1f}, {g.high:+.1f}]"


def summary_table(name: str, spec: dict) -> str:
    """The markdown of one table with per-variant intervals: Δ, Welch p, Holm p, g [CI], verdict."""
    n, base = spec["n"], spec["baseline"]
    rows = spec["variants"]
    printed = spec.get("printed_p", {})
    others = [v for v in rows if v != base]
    welch = {v: welch_from_moments(*moments(rows[v], n), *moments(rows[base], n)) for v in others}
    adjusted = dict(zip(others, holm([welch[v].p for v in others])))
    lines = [f"Restated from the printed means and intervals ({spec['metric']}, n = {n} a variant, against "
             f"`{base}`; Holm over the {len(others)} comparisons; `python benchmarks/legacy_table_stats.py`):", "",
             "| variant | Δ [95% CI] | p | p printed | p (Holm) | Hedges' g [95% CI] | verdict |",
             "|---|---|---|---|---|---|---|"]
    for v in others:
        w, g = welch[v], hedges_g_from_moments(*moments(rows[v], n), *moments(rows[base], n))
        shown = adjusted[v] < 0.05
        verdict = (f"{v} {'>' if w.diff > 0 else '<'} {base}" if shown else "not shown")
        lines.append(f"| {v} | {w.diff:+.3f} [{w.low:+.3f}, {w.high:+.3f}] | {_p(w.p)} | "
                     f"{_p(printed[v]) if v in printed else '—'} | {_p(adjusted[v])} | {_g(g)} | {verdict} |")
    return "\n".join(lines) + "\n"


def d_table(name: str, spec: dict) -> str:
    """g and its interval from a printed Cohen's d with n seeds a group (equal groups)."""
    n = spec["n"]
    lines = [f"Hedges' g with its interval, from the printed d ({spec['metric']}, n = {n} a group; "
             "`python benchmarks/legacy_table_stats.py`):", "", "| comparison | d printed | Hedges' g [95% CI] |",
             "|---|---|---|"]
    for label, d in spec["d"].items():
        lines.append(f"| {label} | {d:+.1f} | {_g(hedges_g_from_moments(n, d, 1.0, n, 0.0, 1.0))} |")
    return "\n".join(lines) + "\n"


def render(name: str, spec: dict) -> str:
    return d_table(name, spec) if "d" in spec else summary_table(name, spec)


def _rewrite(doc: Path, specs: dict) -> tuple[str, list[str]]:
    text, stale = doc.read_text(), []

    def sub(m: re.Match) -> str:
        made = render(m["name"], specs[m["name"]])
        if made != m["body"]:
            stale.append(m["name"])
        return f"<!-- legacy stats {m['name']} -->\n{made}<!-- /legacy stats -->"

    return BLOCK_RE.sub(sub, text), stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--update", metavar="DOC.md", nargs="*",
                    help="rewrite the docs' `<!-- legacy stats NAME -->` blocks (default: docs/reproductions-history.md "
                         "and docs/reproductions.md)")
    ap.add_argument("--check", metavar="DOC.md", nargs="*",
                    help="exit 1, naming them, when a block differs from its output (default: the same pages)")
    args = ap.parse_args(argv)
    specs = yaml.safe_load(SUMMARIES.read_text())
    if args.update is None and args.check is None:
        print("\n".join(f"## {name}\n\n{render(name, spec)}" for name, spec in specs.items()))
        return 0
    docs = [Path(d) for d in (args.update if args.update is not None else args.check)] or DOCS
    failed = False
    for doc in docs:
        text, stale = _rewrite(doc, specs)
        if args.update is not None:
            doc.write_text(text)
            print(f"legacy stats: {len(stale)} block(s) of {doc} rewritten")
        elif stale:
            print(f"legacy stats: blocks of {doc} differ from their output: {', '.join(stale)}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
