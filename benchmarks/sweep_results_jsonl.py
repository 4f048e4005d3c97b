"""One JSON line per run of a finished `credo ablate` sweep: the raw per-run results to commit beside a table.

    python benchmarks/sweep_results_jsonl.py runs/ablations/tail_batching docs/results/tail_batching.jsonl \
        [--commit SHA]

Each line: sweep, variant, seed, commit (of the code that ran, default this checkout's HEAD), date (the run's
last metrics row), host, the run's overrides, its final metrics (the last logged value of every non-perf key,
plus the mean of the per-step `perf/step_time_s`) and its eval curve ([step, eval/accuracy] pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path


def run_line(sweep: dict, run: dict, root: Path, commit: str, host: str) -> dict:
    metrics_path = root / run["run_dir"] / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    final: dict = {}
    for row in rows:
        final.update({k: v for k, v in row.items() if not k.startswith("perf/") and k != "step"})
    steps = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r]
    final["steps"] = max(r["step"] for r in rows)
    final["step_time_s_mean"] = statistics.mean(steps) if steps else None
    curve = [[r["step"], r["eval/accuracy"]] for r in rows if "eval/accuracy" in r]
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(metrics_path.stat().st_mtime))
    return {"sweep": sweep["name"], "variant": run["variant"], "seed": run["seed"], "commit": commit, "date": when,
            "host": host, "overrides": run["overrides"], "wall_s": run.get("wall_s"), "final": final,
            "eval_curve": curve}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", help="a sweep's output_dir (with sweep.json)")
    p.add_argument("out", help="the JSONL file to write")
    p.add_argument("--commit", default=None, help="the commit the runs ran (default: HEAD of this checkout)")
    args = p.parse_args()
    root = Path(args.sweep_dir)
    sweep = json.loads((root / "sweep.json").read_text())
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent).stdout.strip()
    host = f"{platform.node()} ({os.cpu_count()} cores)"
    lines = [run_line(sweep, run, root, commit, host) for run in sweep["runs"] if run["status"] == "done"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"{len(lines)} runs -> {args.out}")


if __name__ == "__main__":
    main()
