"""Raw per-run results of the Complementary RL sweep as JSON lines (docs/results/complementary.jsonl).

    python benchmarks/complementary_results.py runs/ablations/complementary > docs/results/complementary.jsonl

One line per finished run: sweep, variant, seed, commit, date, host, its final metrics (the last row's values of
the keys below) and its eval curve ([step, eval/return] at every evaluation).
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


if __name__ == "__main__":
    main(sys.argv[1])
