"""A sweep's results: each run reduced to one number per metric, statistics over seeds, tables and curves.

Outputs in the sweep's output_dir:

- `table.md`: a row per variant (mean ± sample std over finished seeds, n), then a table per metric with
  the 95% Student-t confidence interval of each variant's mean and, when the sweep names a baseline, each
  variant's difference from it with its 95% Welch confidence interval, Welch p-value and a `*` where that
  interval excludes 0 (statistics in `credo.ablate.stats`);
- `table.csv`: the same numbers, per metric the columns `<label> mean`, `std`, `n`, `ci95 low`,
  `ci95 high` and, with a baseline, `diff`, `diff ci95 low`, `diff ci95 high`, `welch df`, `welch p`,
  `diff ci excludes 0`, `cohen d` (the difference in pooled standard deviations);
- `curves.png`: per curve key, each variant's mean over seeds against step with its 95% t-interval band.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from credo.ablate.plan import Run
from credo.ablate.spec import Metric, Sweep
from credo.ablate.stats import MeanCI, WelchDiff, mean_ci, welch_diff
from credo.tracking import read_metrics

CONFIDENCE = 0.95
CSV_STAT_COLUMNS = ("mean", "std", "n", "ci95 low", "ci95 high")
CSV_DIFF_COLUMNS = ("diff", "diff ci95 low", "diff ci95 high", "welch df", "welch p", "diff ci excludes 0", "cohen d")


@dataclass
class VariantResult:
    variant: str
    n: int
    """Finished seeds."""
    seeds: list[int]
    values: dict[str, list[float]]
    """Metric label -> one number per finished seed that logged the metric."""
    stats: dict[str, MeanCI]
    """Metric label -> statistics of values."""
    vs_baseline: dict[str, WelchDiff] = field(default_factory=dict)
    """Metric label -> difference from the baseline; empty for the baseline itself and without one."""


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def reduce_metric(rows: list[dict], metric: Metric) -> float | None:
    """One run's curve of metric.key to one number (None when the run never logged it)."""
    vals = [float(r[metric.key]) for r in sorted(rows, key=lambda r: r.get("step", 0))
            if isinstance(r.get(metric.key), (int, float)) and math.isfinite(r[metric.key])]
    if not vals:
        return None
    if metric.reduce == "final":
        return vals[-1]
    if metric.reduce == "gain":  # e.g. final eval accuracy minus the step-0 eval of the warm-up
        return vals[-1] - vals[0]
    if metric.reduce == "best":
        return max(vals) if metric.mode == "max" else min(vals)
    tail = vals[-metric.k:]
    return sum(tail) / len(tail)


def summarize(sweep: Sweep, runs: list[Run]) -> list[VariantResult]:
    """Per variant, over its finished runs: each metric's values, their statistics and the baseline difference."""
    out = []
    for variant in sweep.variants:
        done = [r for r in runs if r.variant == variant and r.status == "done"]
        rows = {r.seed: read_metrics(r.run_dir / "metrics.jsonl") for r in done}
        values = {m.label: [v for v in (reduce_metric(rows[r.seed], m) for r in done) if v is not None]
                  for m in sweep.metrics}
        out.append(VariantResult(variant=variant, n=len(done), seeds=[r.seed for r in done], values=values,
                                 stats={lab: mean_ci(vals, CONFIDENCE) for lab, vals in values.items()}))
    base = next((res for res in out if res.variant == sweep.baseline), None)
    for res in out:
        if base is not None and res is not base:
            res.vs_baseline = {lab: welch_diff(vals, base.values[lab], CONFIDENCE) for lab, vals in res.values.items()}
    return out


def _fmt(x: float | None, sign: bool = False) -> str:
    if x is None or math.isnan(x):
        return "—"
    if math.isinf(x):
        return str(x)
    text = f"{x:.3f}" if x == 0 or 0.01 <= abs(x) < 1000 else f"{x:.3g}"
    return f"+{text}" if sign and x > 0 else text


def _fmt_p(p: float) -> str:
    if math.isnan(p):
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _interval(low: float, high: float, sign: bool = False) -> str:
    return "—" if math.isnan(low) else f"[{_fmt(low, sign)}, {_fmt(high, sign)}]"


def _overview(sweep: Sweep, results: list[VariantResult]) -> list[str]:
    labels = [m.label for m in sweep.metrics]
    lines = ["| variant | n | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
    for res in results:
        cells = []
        for lab in labels:
            s = res.stats[lab]
            cell = _fmt(s.mean) if math.isnan(s.std) else f"{_fmt(s.mean)} ± {_fmt(s.std)}"
            cells.append(cell + (f" (n={s.n})" if s.n != res.n else ""))
        lines.append(f"| {res.variant} | {res.n} | " + " | ".join(cells) + " |")
    return lines + ["", "Mean ± sample standard deviation over seeds; n = finished seeds."]


def _metric_table(sweep: Sweep, results: list[VariantResult], label: str) -> list[str]:
    pct = f"{CONFIDENCE:.0%}"
    head = ["variant", "n", "mean ± std", f"{pct} CI (t)"]
    if sweep.baseline:
        head += [f"Δ vs {sweep.baseline}", f"{pct} CI of Δ (Welch)", "p (Welch)", "CI of Δ excludes 0", "d (pooled std)"]
    lines = [f"### {label}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        s = res.stats[label]
        cells = [res.variant, str(s.n), _fmt(s.mean) if math.isnan(s.std) else f"{_fmt(s.mean)} ± {_fmt(s.std)}",
                 _interval(s.low, s.high)]
        if sweep.baseline:
            d = res.vs_baseline.get(label)
            cells += (["baseline", "", "", "", ""] if d is None else
                      [_fmt(d.diff, sign=True), _interval(d.low, d.high, sign=True), _fmt_p(d.p),
                       "*" if d.excludes_zero else "", _fmt(d.d, sign=True)])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _method_note(sweep: Sweep) -> list[str]:
    pct = f"{CONFIDENCE:.0%}"
    note = (f"{pct} CI (t): Student-t confidence interval of the mean over seeds, mean ± t(0.975, n−1)·s/√n "
            "(— when n < 2).")
    if sweep.baseline:
        note += (f" Δ: the variant's mean minus the mean of the baseline `{sweep.baseline}`, with its {pct} confidence "
                 "interval and two-sided p-value from Welch's t-test (unequal variances, Welch–Satterthwaite degrees "
                 f"of freedom); * marks a Δ whose {pct} CI excludes 0; d: Cohen's d, Δ in units of the pooled "
                 "standard deviation of the two variants' seeds (the testbed's separation). No correction for comparing "
                 "several variants and metrics.")
    return [note, ""]


def write_tables(sweep: Sweep, results: list[VariantResult]) -> None:
    """table.md and table.csv in sweep.output_dir (format in this module's docstring)."""
    lines = [f"# {sweep.name}", ""]
    if sweep.description:
        lines += [sweep.description, ""]
    lines += [f"Base recipe `{sweep.base}`, seeds {sweep.seeds}"
              + (f", baseline `{sweep.baseline}`" if sweep.baseline else "") + f"; sweep file `{sweep.path}`.", ""]
    lines += _overview(sweep, results) + ["", "## Per metric", ""] + _method_note(sweep)
    for m in sweep.metrics:
        lines += _metric_table(sweep, results, m.label)
    lines += ["Variants:", ""]
    for v in sweep.variants:
        lines.append(f"- `{v}`: " + (" ".join(f"`{o}`" for o in sweep.variants[v]) or "the base recipe"))
    if sweep.overrides:
        lines += ["", "Every run: " + " ".join(f"`{o}`" for o in sweep.overrides)]
    atomic_write(sweep.output_dir / "table.md", "\n".join(lines) + "\n")
    _write_csv(sweep, results)


def _csv_cell(x) -> object:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _write_csv(sweep: Sweep, results: list[VariantResult]) -> None:
    labels = [m.label for m in sweep.metrics]
    parts = CSV_STAT_COLUMNS + (CSV_DIFF_COLUMNS if sweep.baseline else ())
    tmp = sweep.output_dir / "table.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "n"] + [f"{lab} {part}" for lab in labels for part in parts])
        for res in results:
            row = [res.variant, res.n]
            for lab in labels:
                s = res.stats[lab]
                row += [s.mean, s.std, s.n, s.low, s.high]
                if sweep.baseline:
                    d = res.vs_baseline.get(lab)
                    row += ([None] * len(CSV_DIFF_COLUMNS) if d is None else
                            [d.diff, d.low, d.high, d.df, d.p, "true" if d.excludes_zero else "false", d.d])
            w.writerow([_csv_cell(x) for x in row])
    os.replace(tmp, sweep.output_dir / "table.csv")


def curve_stats(sweep: Sweep, runs: list[Run]) -> dict[str, dict[str, tuple[list[int], list[MeanCI]]]]:
    """Curve key -> variant -> (steps, statistics over the finished seeds at each step).

    Only steps at which some finished seed logged a finite value appear; a variant with none is left out.
    """
    metrics = {id(r): read_metrics(r.run_dir / "metrics.jsonl") for r in runs if r.status == "done"}
    out: dict[str, dict[str, tuple[list[int], list[MeanCI]]]] = {}
    for key in sweep.curves or [m.key for m in sweep.metrics]:
        out[key] = {}
        for variant in sweep.variants:
            per_step: dict[int, list[float]] = {}
            for r in runs:
                for row in metrics.get(id(r), []) if r.variant == variant else []:
                    v = row.get(key)
                    if isinstance(v, (int, float)) and math.isfinite(v):
                        per_step.setdefault(int(row["step"]), []).append(float(v))
            if per_step:
                steps = sorted(per_step)
                out[key][variant] = (steps, [mean_ci(per_step[s], CONFIDENCE) for s in steps])
    return out


def plot_sweep_curves(sweep: Sweep, runs: list[Run]) -> None:
    """Mean curve per variant over its finished seeds with a 95% Student-t band, one panel per curve key.

    At a step that fewer than 2 seeds logged, the band has a gap (no estimate of the spread).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curve_stats(sweep, runs)
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.4), constrained_layout=True, squeeze=False)
    for ax, (key, by_variant) in zip(axes[0], curves.items()):
        for i, variant in enumerate(sweep.variants):
            if variant not in by_variant:
                continue
            steps, stats = by_variant[variant]
            color = f"C{i % 10}"
            ax.plot(steps, [s.mean for s in stats], color=color, label=variant, marker="o" if len(steps) <= 12 else None,
                    ms=3)
            ax.fill_between(steps, [s.low for s in stats], [s.high for s in stats], color=color, alpha=0.15, linewidth=0)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{sweep.name}: mean over seeds, {CONFIDENCE:.0%} Student-t band", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    tmp = sweep.output_dir / "curves.tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, sweep.output_dir / "curves.png")
