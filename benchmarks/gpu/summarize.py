"""Collect the device run's figures into one JSON file (run by benchmarks/gpu/h200.sh after each stage, so a later
stage's failure loses nothing already measured).

Usage: python3 benchmarks/gpu/summarize.py RES_DIR SUMMARY_JSON   (RES_DIR: the stages' files)
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

# docs/getting-started.md, hf row: 2026-11-29, commit c3ebaa9, this project's 2-core CPU machine (not bit-comparable:
# another device, other kernels, TF32 off/on and reduction orders all change the sampled tokens).
QUICKSTART_CPU_REFERENCE = {"eval/accuracy@0": 0.439, "eval/accuracy@20": 0.809, "eval/accuracy@100": 0.903,
                            "rl_step_time_s_median": 0.20}


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def quickstart(out: Path) -> dict | None:
    path = out / "quickstart_metrics.jsonl"
    if not path.exists():
        return None
    rows = read_jsonl(path)
    evals = {f"eval/accuracy@{r['step']}": r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    steps = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r]
    res = {"last_step": max((r.get("step", 0) for r in rows), default=0), **evals,
           "rl_step_time_s_median": statistics.median(steps) if steps else None,
           "rl_step_time_s_median_after_step1": statistics.median(steps[1:]) if len(steps) > 1 else None,
           "rollout_s_median": statistics.median(r["perf/rollout_s"] for r in rows if "perf/rollout_s" in r)
           if steps else None,
           "peak_gpu_gib (perf/peak_rss_gb, = torch.cuda.max_memory_allocated on CUDA)":
               max((r["perf/peak_rss_gb"] for r in rows if "perf/peak_rss_gb" in r), default=None),
           "cpu_reference_docs_getting_started": QUICKSTART_CPU_REFERENCE}
    wall = out / "quickstart_wall_s.txt"
    if wall.exists():
        res["wall_s_incl_sft_warmup"] = float(wall.read_text().split()[0])
    return res


def logprob_table(out: Path) -> list[dict] | None:
    path = out / "logprob_memory.md"
    if not path.exists():
        return None
    rows = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[0]):
            keys = ["V", "N", "outputs", "method", "chunk", "peak_mib", "memory_vs_naive", "fwd_bwd_wall_s",
                    "wall_vs_naive", "cpu_vs_naive"]
            rows.append(dict(zip(keys, cells)))
    return rows


def main() -> int:
    out, dest = Path(sys.argv[1]), Path(sys.argv[2])
    summary: dict = {}
    env = out / "env.json"
    if env.exists():
        summary["env"] = json.loads(env.read_text())
    summary["quickstart"] = quickstart(out)
    for engine in ("deepspeed", "fsdp2"):  # the quickstart under each engine (h200.sh stage 1)
        sub = out / f"quickstart_{engine}"
        if sub.is_dir():
            summary[f"quickstart_{engine}"] = quickstart(sub)
    for name in ("update_0.6b", "update_4b", "update_tiny"):  # benchmarks/gpu/update_mfu.py, both engines
        f = out / f"{name}.json"
        if f.exists():
            summary[name] = json.loads(f.read_text())
    for name in ("qwen3_4b", "qwen3_0.6b", "qwen3_tiny"):
        f = out / f"{name}.json"
        if f.exists():
            r = json.loads(f.read_text())
            summary[name] = r
    summary["logprob_memory"] = logprob_table(out)
    stages = out / "stages.txt"
    if stages.exists():
        summary["stages"] = stages.read_text().splitlines()
    dest.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
