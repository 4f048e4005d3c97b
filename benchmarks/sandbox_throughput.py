"""Sandbox throughput: programs/s through `credo.sandbox.run_python` against a bare subprocess of the same
interpreter, at 1..N concurrent callers (threads, as reward workers call it). Measure on an idle host.

    python benchmarks/sandbox_throughput.py --programs 200 --threads 1 2 4 [--json out.json]

A program is the code task's harness on a right answer (`credo.tasks.code`), so the figure is the reward's cost per
sample. The bare baseline is `python3 -I` in a subprocess with pipes, no namespaces and no limits: the difference
is what the sandbox adds (bubblewrap's namespaces and mounts, the launcher, the host's /proc check).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from credo.sandbox import bwrap, run_python
from credo.tasks.code import _HARNESS, CodeTask


def programs(n: int) -> list[str]:
    task = CodeTask(train_size=n, eval_size=1, seed=0)
    return [p.prompt + p.answer + _HARNESS.format(inputs=p.meta["inputs"]) for p in (task.train(i) for i in range(n))]


def sandboxed(code: str) -> float:
    t0 = time.perf_counter()
    res = run_python(code, timeout_s=5, memory_mb=128)
    assert res.reason == "ok", res
    return time.perf_counter() - t0


def bare(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([bwrap.python_path(), "-I", "-c", code], capture_output=True, check=True, timeout=5)
    return time.perf_counter() - t0


def measure(fn, codes: list[str], threads: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        lat = list(ex.map(fn, codes))
    wall = time.perf_counter() - t0
    return {"programs_per_s": len(codes) / wall, "latency_ms_median": 1e3 * statistics.median(lat),
            "latency_ms_p95": 1e3 * sorted(lat)[int(0.95 * (len(lat) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    codes = programs(args.programs)
    sandboxed(codes[0]), bare(codes[0])  # warm the page cache
    rows = []
    for t in args.threads:
        s, b = measure(sandboxed, codes, t), measure(bare, codes, t)
        rows.append({"threads": t, "sandbox": s, "bare": b,
                     "overhead_ms_median": s["latency_ms_median"] - b["latency_ms_median"]})
    print(f"host: {platform.processor() or platform.machine()}, {args.programs} programs per cell")
    print("| threads | sandbox programs/s | bare programs/s | sandbox median ms | bare median ms | overhead ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threads']} | {r['sandbox']['programs_per_s']:.1f} | {r['bare']['programs_per_s']:.1f} | "
              f"{r['sandbox']['latency_ms_median']:.0f} | {r['bare']['latency_ms_median']:.0f} | "
              f"{r['overhead_ms_median']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
