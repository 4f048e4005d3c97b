"""Collect a finished polymath sweep into one line per run with its per-discipline gains, and print the gain table.

    python benchmarks/polymath_results.py [--sweep recipes/ablations/polymath.yaml ...] [--out runs/ablations/polymath/gains.jsonl]

Several sweeps (e.g. one variant rerun as a sweep of its own) make one table; the baseline is
the first sweep's.

One JSON line per run: sweep, variant, seed, commit, date, host, the run's final metrics (every eval/* at the last
step, and the last-10-step means of the train and polymath monitors), its gains over the step-0 evaluation (the
warm-up) and its eval curve. The table: per variant and discipline, the mean gain over seeds with a 95% Student-t
interval, and the difference from the full-data baseline (Welch), from credo.ablate.stats.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import socket
import subprocess
from pathlib import Path

from credo.ablate import load_sweep, mean_ci, welch_diff
from credo.tracking import read_metrics

MONITORS = ("train/reward_mean", "train/entropy", "train/response_len", "polymath/format_frac",
            "polymath/distinct_frac", "polymath/sampled_nll", "perf/step_time_s", "perf/peak_rss_gb")


def run_record(sweep, variant: str, seed: int, run_dir: Path, commit: str, host: str) -> dict | None:
    """One run's line, or None when it has not finished."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "eval/accuracy" in r]
    if not evals or evals[-1]["step"] < max(r["step"] for r in rows) or len(evals) < 2:
        return None
    keys = sorted(k for k in evals[-1] if k.startswith("eval/"))
    tail = [r for r in rows if r.get("step", 0) > 0][-10:]
    final = {k: evals[-1][k] for k in keys}
    final.update({k: sum(r[k] for r in tail if k in r) / max(1, sum(k in r for r in tail)) for k in MONITORS
                  if any(k in r for r in tail)})
    stamp = dt.datetime.fromtimestamp((run_dir / "metrics.jsonl").stat().st_mtime).isoformat(timespec="seconds")
    return {"sweep": sweep.name, "variant": variant, "seed": seed, "commit": commit, "date": stamp, "host": host,
            "steps": evals[-1]["step"], "final": final, "gain": {k: evals[-1][k] - evals[0][k] for k in keys},
            "eval_curve": [{k: r[k] for k in ["step", *keys]} for r in evals]}


def table(records: list[dict], baseline: str) -> str:
    """Markdown: mean gain [95% CI] per variant and discipline, and the difference from the baseline."""
    variants = list(dict.fromkeys(r["variant"] for r in records))
    keys = sorted({k for r in records for k in r["gain"]}, key=lambda k: (k != "eval/accuracy", k))
    lines = ["| variant | n | " + " | ".join(k.removeprefix("eval/") for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    gains = {v: {k: [r["gain"][k] for r in records if r["variant"] == v and k in r["gain"]] for k in keys}
             for v in variants}
    for v in variants:
        cells = []
        for k in keys:
            ci = mean_ci(gains[v][k], 0.95)
            cell = f"{ci.mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]"
            if v != baseline and baseline in gains:
                d = welch_diff(gains[v][k], gains[baseline][k], 0.95)
                cell += f"<br>Δ {d.diff:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
            cells.append(cell)
        lines.append(f"| {v} | {len(gains[v][keys[0]])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", nargs="+", default=["recipes/ablations/polymath.yaml"])
    ap.add_argument("--out", default="runs/ablations/polymath/gains.jsonl")
    a = ap.parse_args()
    sweeps = [load_sweep(path) for path in a.sweep]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    host = socket.gethostname()
    records = []
    for sweep in sweeps:
        for variant in sweep.variants:
            for seed in sweep.seeds:
                rec = run_record(sweep, variant, seed, sweep.output_dir / "runs" / variant / f"seed{seed}", commit, host)
                # a (variant, seed) that two sweeps both finished is the same run twice: count it once
                if rec is not None and not any((r["variant"], r["seed"]) == (variant, seed) for r in records):
                    records.append(rec)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} runs -> {a.out}\n")
    print(table(records, sweeps[0].baseline))


if __name__ == "__main__":
    main()
