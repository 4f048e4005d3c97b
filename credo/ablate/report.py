"""A sweep's results reduced and compared: per-run numbers, statistics over seeds, comparisons, curves.

Everything here works on results records (`credo.ablate.results`), so a table is the same whether it is
made at the end of `credo ablate` or later from the committed results file by `credo report`.

- Each run's curve of a metric becomes one number (`reduce_curve`): final, first, best, last_k_mean, gain (last
  minus first), auc (the area under the curve over the steps it spans, divided by that span: the curve's
  mean level, in the metric's units) or slope (least-squares slope over the last fifth of the run, per 100
  steps; over the last two logged points when fewer than two fall in the last fifth).
- Per variant and metric: mean, standard deviation and Student-t interval over seeds (`credo.ablate.stats`).
- Each variant against the baseline, and each comparison named in the sweep: the difference of means with
  its 95% interval and p-value (paired t-test when both variants ran the same seeds and each seed's two runs
  share a warm-up; Welch's test otherwise), the Holm-adjusted p over the table's comparisons, and the effect size
  with its interval: g_av for a paired comparison (`credo.ablate.stats.paired_g_av`), Hedges' g for a Welch one.
  A verdict needs the adjusted p below 0.05.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from credo.ablate.results import curve_points
from credo.ablate.spec import Comparison, Metric
from credo.ablate.stats import EffectSize, MeanCI, hedges_g, holm, mean_ci, paired_diff, paired_g_av, welch_diff

CONFIDENCE = 0.95
ALPHA = 0.05
SLOPE_PER = 100
"""The slope is reported per this many steps."""


def reduce_curve(points: list[tuple[int, float]], metric: Metric) -> float | None:
    """One run's curve, (step, value) pairs sorted by step, to one number (None when it has no point)."""
    points = [(s, v) for s, v in points if math.isfinite(v)]
    if not points:
        return None
    vals = [v for _, v in points]
    if metric.reduce == "final":
        return vals[-1]
    if metric.reduce == "first":  # e.g. the step-0 eval: the warm-up's level
        return vals[0]
    if metric.reduce == "gain":  # e.g. final eval accuracy minus the step-0 eval of the warm-up
        return vals[-1] - vals[0]
    if metric.reduce == "best":
        return max(vals) if metric.mode == "max" else min(vals)
    if metric.reduce == "auc":
        if len(points) == 1:
            return vals[0]
        area = math.fsum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:]))
        return area / (points[-1][0] - points[0][0])
    if metric.reduce == "slope":
        return _tail_slope(points)
    tail = vals[-metric.k:]
    return sum(tail) / len(tail)


def _tail_slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope (per SLOPE_PER steps) over the points in the last fifth of the curve's step span."""
    first, last = points[0][0], points[-1][0]
    tail = [p for p in points if p[0] >= last - (last - first) / 5]
    if len(tail) < 2:
        tail = points[-2:]
    if len(tail) < 2:
        return None
    mx = math.fsum(s for s, _ in tail) / len(tail)
    my = math.fsum(v for _, v in tail) / len(tail)
    sxx = math.fsum((s - mx) ** 2 for s, _ in tail)
    return SLOPE_PER * math.fsum((s - mx) * (v - my) for s, v in tail) / sxx


def reduce_metric(rows: list[dict], metric: Metric) -> float | None:
    """One run's metrics.jsonl rows to one number (None when the run never logged the metric)."""
    points = sorted((int(r.get("step", 0)), float(r[metric.key])) for r in rows
                    if isinstance(r.get(metric.key), (int, float)) and not isinstance(r[metric.key], bool))
    return reduce_curve(points, metric)


@dataclass
class VariantResult:
    variant: str
    n: int
    """Runs of this variant in the results."""
    seeds: list[int]
    values: dict[str, dict[int, float]]
    """Metric label -> seed -> the run's number (seeds whose run never logged the metric are absent)."""
    stats: dict[str, MeanCI]
    """Metric label -> statistics of the values over seeds."""
    warmups: dict[int, str | None] = field(default_factory=dict)
    """Seed -> the warm-up key the run started from."""


@dataclass
class Compared:
    """Variant a against variant b on one metric."""

    a: str
    b: str
    label: str
    expect: str
    """'>' or '<' when the direction was named in advance, 'vs' when not (baseline rows: 'vs')."""
    test: str
    """'paired' (same seeds, each seed's two runs from one warm-up) or 'Welch'."""
    n: int
    """Pairs (paired) or the smaller group's size (Welch)."""
    diff: float
    low: float
    high: float
    p: float
    g: EffectSize
    p_holm: float = math.nan
    """p adjusted by Holm over the comparisons of its table."""
    named_before: str = ""
    """For a named comparison: 'yes', 'no' or 'unknown', from git (credo.ablate.prereg.named_before); '' when not
    asked (a baseline row, or a summary made without the files that name the comparisons)."""

    @property
    def shown(self) -> bool:
        return self.p_holm < ALPHA

    @property
    def verdict(self) -> str:
        """What the adjusted test shows: the direction, and for a named comparison whether it is the named one."""
        if not self.shown:
            return "not shown"
        direction = ">" if self.diff > 0 else "<"
        if self.expect == "vs":
            return f"{self.a} {direction} {self.b}"
        return "as named" if direction == self.expect else "reversed"


@dataclass
class Summary:
    metrics: list[Metric]
    variants: list[VariantResult]
    baseline: str | None
    vs_baseline: dict[str, dict[str, Compared]]
    """Metric label -> variant -> its comparison with the baseline (Holm over the variants of that metric)."""
    named: list[Compared]
    """The comparisons named in advance, on the first metric (Holm over them)."""
    records: list[dict]

    def variant(self, name: str) -> VariantResult:
        return next(v for v in self.variants if v.variant == name)


def _variant_result(name: str, recs: list[dict], metrics: list[Metric]) -> VariantResult:
    values = {}
    for m in metrics:
        per_seed = {r["seed"]: reduce_curve(curve_points(r, m.key), m) for r in recs}
        values[m.label] = {s: v for s, v in per_seed.items() if v is not None}
    return VariantResult(variant=name, n=len(recs), seeds=[r["seed"] for r in recs], values=values,
                         stats={lab: mean_ci(list(v.values()), CONFIDENCE) for lab, v in values.items()},
                         warmups={r["seed"]: r.get("warmup_key") for r in recs})


def compare(a: VariantResult, b: VariantResult, label: str, expect: str = "vs") -> Compared:
    """a against b on one metric: paired when both have the same seeds and each seed's runs share a warm-up."""
    va, vb = a.values[label], b.values[label]
    paired = (set(va) == set(vb) and len(va) >= 2 and all(a.warmups.get(s) == b.warmups.get(s) for s in va))
    xs, ys = list(va.values()), list(vb.values())
    if paired:
        seeds = sorted(va)
        pa, pb = [va[s] for s in seeds], [vb[s] for s in seeds]
        r, g = paired_diff(pa, pb, CONFIDENCE), paired_g_av(pa, pb, CONFIDENCE)
        test, n = "paired", r.n
    else:
        r, g = welch_diff(xs, ys, CONFIDENCE), hedges_g(xs, ys, CONFIDENCE)
        test, n = "Welch", min(len(xs), len(ys))
    return Compared(a=a.variant, b=b.variant, label=label, expect=expect, test=test, n=n, diff=r.diff, low=r.low,
                    high=r.high, p=r.p, g=g)


def _adjust(family: list[Compared]) -> None:
    for c, adjusted in zip(family, holm([c.p for c in family])):
        c.p_holm = adjusted


def summarize_records(records: list[dict], metrics: list[Metric], *, variants: list[str] | None = None,
                      baseline: str | None = None, comparisons: list[Comparison] = ()) -> Summary:
    """Statistics over seeds of each variant, its comparison with the baseline and the named comparisons.

    Args:
        records: results records of one sweep (one per variant and seed).
        metrics: how each run becomes one number per column.
        variants: the order of the rows (default: the order of first appearance); variants named here that
            have no record appear with n = 0.
        baseline: the variant every other is compared with, Holm-adjusted per metric over those comparisons.
        comparisons: named in advance; compared on metrics[0], Holm-adjusted together.

    Raises:
        ValueError: two records of one (variant, seed), a baseline or comparison naming no variant, or a metric
            whose curve no record holds.
    """
    seen = set()
    for r in records:
        if (r["variant"], r["seed"]) in seen:
            raise ValueError(f"two results of variant '{r['variant']}' seed {r['seed']}; expected one line per run")
        seen.add((r["variant"], r["seed"]))
    order = list(variants or dict.fromkeys(r["variant"] for r in records))
    for name in [baseline] + [v for c in comparisons for v in (c.a, c.b)]:
        if name is not None and name not in order:
            raise ValueError(f"'{name}' names no variant of these results (variants: {', '.join(order)})")
    if records:  # a key no run recorded would give an empty table and exit 0: name it instead
        recorded = sorted({k for r in records for k in r.get("curves", {})})
        for m in metrics:
            if m.key not in recorded:
                raise ValueError(f"metric '{m.key}': no run of these results recorded its curve (curves recorded: "
                                 f"{', '.join(recorded) or 'none'}); a results line keeps the curves of its sweep's "
                                 "`curves` and `metrics` keys, and the last value of every key under `final`")
    results = [_variant_result(v, [r for r in records if r["variant"] == v], metrics) for v in order]
    by_name = {v.variant: v for v in results}
    vs_baseline: dict[str, dict[str, Compared]] = {}
    if baseline is not None:
        for m in metrics:
            vs_baseline[m.label] = {v.variant: compare(v, by_name[baseline], m.label) for v in results
                                    if v.variant != baseline}
            _adjust(list(vs_baseline[m.label].values()))
    named = [compare(by_name[c.a], by_name[c.b], metrics[0].label, c.expect) for c in comparisons]
    _adjust(named)
    return Summary(metrics=metrics, variants=results, baseline=baseline, vs_baseline=vs_baseline, named=named,
                   records=records)


def warmup_design(records: list[dict]) -> str:
    """One sentence: whether each seed trained its own warm-up (its variance inside the intervals) or all shared one."""
    if all(r.get("warmup_key") is None for r in records):
        return "No SFT warm-up."
    variants = {r["variant"] for r in records}
    keys = {v: [r.get("warmup_key") for r in records if r["variant"] == v] for v in variants}
    shared = all(len({r.get("warmup_key") for r in records if r["seed"] == s}) == 1 for s in {r["seed"] for r in records})
    if all(len(set(k)) == 1 for k in keys.values()) and any(len(k) > 1 for k in keys.values()):
        sft_seeds = sorted({r.get("sft_seed") for r in records if r.get("sft_seed") is not None})
        return (f"Warm-up pinned (warm-up seed {', '.join(map(str, sft_seeds))}): every seed of a variant starts from "
                "one warm-up, so the intervals leave warm-up variance out.")
    if all(len(set(k)) == len(k) for k in keys.values()):
        return ("Each seed trains its own warm-up: the intervals include warm-up variance" + (
            "." if len(variants) == 1 else "; the variants of a seed share its warm-up, so differences are paired by seed."
            if shared else "; comparisons between variants whose seeds share a warm-up are paired, the others Welch."))
    return "Warm-ups are mixed (some seeds share one, some not): see warmup_key in the results file."


def curve_stats(records: list[dict], keys: list[str], variants: list[str]) -> dict[str, dict[str, tuple[list[int], list[MeanCI]]]]:
    """Curve key -> variant -> (steps, statistics over the seeds that logged a finite value at each step)."""
    out: dict[str, dict[str, tuple[list[int], list[MeanCI]]]] = {}
    for key in keys:
        out[key] = {}
        for variant in variants:
            per_step: dict[int, list[float]] = {}
            for r in records:
                if r["variant"] == variant:
                    for step, v in curve_points(r, key):
                        if math.isfinite(v):
                            per_step.setdefault(step, []).append(v)
            if per_step:
                steps = sorted(per_step)
                out[key][variant] = (steps, [mean_ci(per_step[s], CONFIDENCE) for s in steps])
    return out


def plot_curves(records: list[dict], keys: list[str], variants: list[str], path, title: str) -> None:
    """Mean curve per variant over its seeds with a 95% Student-t band, one panel per key, written to `path`.

    At a step that fewer than 2 seeds logged, the band has a gap (no estimate of the spread).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curve_stats(records, keys, variants)
    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.4), constrained_layout=True, squeeze=False)
    for ax, (key, by_variant) in zip(axes[0], curves.items()):
        for i, variant in enumerate(variants):
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
    fig.suptitle(f"{title}: mean over seeds, {CONFIDENCE:.0%} Student-t band", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    path = os.fspath(path)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
