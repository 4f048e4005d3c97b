"""Raw per-run results of the Complementary RL sweep as JSON lines (docs/results/complementary.jsonl).

    python benchmarks/complementary_results.py runs/ablations/complementary > docs/results/complementary.jsonl
    python benchmarks/complementary_results.py --table docs/results/complementary.jsonl

One line per finished run: sweep, variant, seed, commit, date, host, its final metrics (the last row's values of
the keys below) and its eval curve ([step, eval/return] at every evaluation). `--table` prints the markdown table of
docs/reproductions.md: per variant the mean and 95% t-interval of the final held-out return, and against
outcome-only RL the Welch difference and the paired (same seed) difference with their 95% intervals.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

FINAL_KEYS = ("eval/return", "train/reward_mean", "complementary/bank_size", "complementary/injected_frac",
              "complementary/with_minus_without", "extractor/reward_mean", "bank/size", "perf/step_time_s",
              "perf/complementary_s")


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(sweep_dir: str) -> None:
    sweep_dir = Path(sweep_dir)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    host = socket.gethostname()
    for run_dir in sorted((sweep_dir / "runs").glob("*/seed*")):
        rows = rows_of(run_dir)
        if not rows or not (run_dir / "final").exists() and "eval/return" not in rows[-1]:
            continue  # not finished
        last = {}
        for r in rows:
            last.update({k: r[k] for k in FINAL_KEYS if k in r})
        stamp = datetime.fromtimestamp((run_dir / "metrics.jsonl").stat().st_mtime, timezone.utc)
        print(json.dumps({"sweep": sweep_dir.name, "variant": run_dir.parent.name, "seed": int(run_dir.name[4:]),
                          "commit": commit, "date": stamp.isoformat(timespec="seconds"), "host": host,
                          "steps": rows[-1]["step"], "final": last,
                          "eval_curve": [[r["step"], r["eval/return"]] for r in rows if "eval/return" in r]}))


def table(path: str) -> None:
    from credo.ablate.stats import mean_ci, welch_diff

    runs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    by = {}
    for r in runs:
        by.setdefault(r["variant"], {})[r["seed"]] = r
    base = by.get("outcome_only", {})
    print("| variant | n | eval/return final (95% CI) | start (step 0) | vs outcome-only (Welch, 95% CI) | "
          "paired by seed (95% CI) | train/reward_mean last | bank size | step time s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in ("outcome_only", "complementary", "frozen"):
        if v not in by:
            continue
        rs = by[v]
        final = [r["final"]["eval/return"] for r in rs.values()]
        start = [r["eval_curve"][0][1] for r in rs.values()]
        m, s0 = mean_ci(final), mean_ci(start)
        row = [v, str(m.n), f"{m.mean:.3f} [{m.low:+.3f}, {m.high:+.3f}]", f"{s0.mean:.3f}"]
        if v != "outcome_only" and base:
            w = welch_diff(final, [r["final"]["eval/return"] for r in base.values()])
            paired = [rs[k]["final"]["eval/return"] - base[k]["final"]["eval/return"] for k in rs if k in base]
            p = mean_ci(paired)
            row += [f"{w.diff:+.3f} [{w.low:+.3f}, {w.high:+.3f}]", f"{p.mean:+.3f} [{p.low:+.3f}, {p.high:+.3f}] (n={p.n})"]
        else:
            row += ["baseline", "baseline"]
        mean = lambda k: sum(r["final"].get(k, 0.0) for r in rs.values()) / len(rs)  # noqa: E731
        row += [f"{mean('train/reward_mean'):.3f}", f"{mean('complementary/bank_size'):.1f}",
                f"{mean('perf/step_time_s'):.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    table(sys.argv[2]) if sys.argv[1] == "--table" else main(sys.argv[1])
