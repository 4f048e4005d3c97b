"""One JSON line per run of a finished `credo ablate` sweep, for docs/results/<name>.jsonl.

    python benchmarks/sweep_results.py runs/ablations/palette --out docs/results/palette.jsonl

Each line: sweep, variant, seed, commit, date (the run's last metrics row's file time), host, status, wall_s, the
run's final value of every logged metric but perf/* (`final`), its eval curve (`eval`: step -> value of each
eval/* key) and its cost (`perf`: the median perf/step_time_s over the steps after the first, the largest
perf/peak_rss_gb). Prints each variant's median step time and peak RSS over its runs. The commit is this checkout's HEAD (the sweep's code; pass --commit to name another).
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

REPO = Path(__file__).resolve().parents[1]


def run_line(sweep: dict, run: dict, root: Path, commit: str, host: str) -> dict:
    folder = root / run["run_dir"]
    path = folder / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    final: dict = {}
    for row in rows:  # the last value of each key (eval rows and train rows interleave)
        final.update({k: v for k, v in row.items() if not k.startswith("perf/")})
    evals = [{k: v for k, v in row.items() if k == "step" or k.startswith("eval/")} for row in rows
             if any(k.startswith("eval/") for k in row)]
    times = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r and r.get("step", 0) > 1]
    rss = [r["perf/peak_rss_gb"] for r in rows if "perf/peak_rss_gb" in r]
    perf = {"step_time_s_median": statistics.median(times) if times else None, "peak_rss_gb": max(rss, default=None)}
    date = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(path.stat().st_mtime)) if path.exists() else None
    return {"sweep": sweep["name"], "variant": run["variant"], "seed": run["seed"], "commit": commit, "date": date,
            "host": host, "status": run["status"], "wall_s": run["wall_s"], "overrides": run["overrides"],
            "final": final, "eval": evals, "perf": perf}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", help="a sweep's output_dir (holds sweep.json)")
    p.add_argument("--out", required=True, help="the .jsonl file to write")
    p.add_argument("--commit", default=None, help="the commit the sweep ran (default: this checkout's HEAD)")
    args = p.parse_args()
    root = Path(args.sweep_dir)
    sweep = json.loads((root / "sweep.json").read_text())
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True).stdout.strip()
    host = f"{platform.node()} ({platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores)"
    lines = [run_line(sweep, run, root, commit, host) for run in sweep["runs"]]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"wrote {len(lines)} runs to {args.out}")
    for variant in dict.fromkeys(x["variant"] for x in lines):
        done = [x["perf"] for x in lines if x["variant"] == variant and x["perf"]["step_time_s_median"] is not None]
        if done:
            print(f"{variant}: {len(done)} runs, median step {statistics.median(d['step_time_s_median'] for d in done):.3f} s, "
                  f"peak RSS {max(d['peak_rss_gb'] for d in done):.2f} GB")


if __name__ == "__main__":
    main()
