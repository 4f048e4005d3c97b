"""FSDP2 against DeepSpeed on this machine, one invocation, the engines alternating round by round: step time,
peak memory and start-up time of the quickstart (one process) and of a 4-layer model under torchrun (2 processes).

Each run is a fresh `credo run` in a fresh run folder; with `--fresh-extensions` each also gets an empty
TORCH_EXTENSIONS_DIR, so DeepSpeed compiles its CPU comm op as on a new machine (FSDP2 needs none). The SFT warm-up
cache (CREDO_CACHE) is shared and filled before the first timed round: the warm-up is no engine's cost.

    python benchmarks/engines.py --rounds 3 --steps 20 --out engines.json                 # both setups
    python benchmarks/engines.py --rounds 1 --steps 4 --set sft.steps=20 --out /tmp/e.json   # a quick check

Per run: wall_s (process start to exit), startup_s (wall_s less the logged steps' time: imports, process group,
model load, engine build, final export), median step time after step 1 (perf/step_time_s), peak RSS
(perf/peak_rss_gb, the largest over steps; rank 0). Medians over rounds are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("deepspeed", "fsdp2")
SETUPS = {
    "quickstart": {"procs": 1, "overrides": []},
    "4layer_torchrun2": {"procs": 2, "overrides": ["model.tiny.num_layers=4"]},
}
DROP = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def one_run(engine: str, setup: str, steps: int, root: Path, fresh_ext: bool, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{setup}-{engine}-", dir=root))
    env = {k: v for k, v in os.environ.items() if k not in DROP}
    env["PYTHONPATH"] = str(REPO)
    if fresh_ext:
        env["TORCH_EXTENSIONS_DIR"] = str(out / "torch_extensions")
    procs = SETUPS[setup]["procs"]
    launch = [sys.executable, "-m", "credo.cli"] if procs == 1 else \
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", "-m", "credo.cli"]
    args = ["run", "recipes/quickstart.yaml", f"run.output_dir={out / 'run'}", f"run.steps={steps}",
            "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false",
            f"engine.backend={engine}", *SETUPS[setup]["overrides"], *extra]
    t = time.perf_counter()
    p = subprocess.run(launch + args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"engine": engine, "setup": setup, "error": p.stderr[-2000:]}
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps_s = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r]
    return {"engine": engine, "setup": setup, "wall_s": wall, "startup_s": wall - sum(steps_s),
            "step_s_median": statistics.median(steps_s[1:] or steps_s),
            "peak_rss_gb": max((r.get("perf/peak_rss_gb", 0.0) for r in rows), default=None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=list(SETUPS))
    ap.add_argument("--fresh-extensions", action="store_true", help="an empty TORCH_EXTENSIONS_DIR per run")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides for every run "
                    "(e.g. sft.steps=20 for a quick check: the quickstart's 600-step warm-up is long on CPU)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="credo-engines-"))
    for setup in args.setups:  # fill the warm-up cache (and the op build) outside the timed rounds
        one_run("deepspeed", setup, 1, root, False, args.set)
    runs = []
    for rnd in range(args.rounds):
        order = ENGINES if rnd % 2 == 0 else ENGINES[::-1]  # alternate which engine goes first
        for setup in args.setups:
            for engine in order:
                r = one_run(engine, setup, args.steps, root, args.fresh_extensions, args.set)
                r["round"] = rnd
                runs.append(r)
                print(json.dumps(r), flush=True)
                Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2) + "\n")
    print("\n| setup | engine | step s (median) | peak RSS GB | start-up s | wall s |\n|---|---|---|---|---|---|")
    for setup in args.setups:
        for engine in ENGINES:
            ok = [r for r in runs if r["setup"] == setup and r["engine"] == engine and "error" not in r]
            if not ok:
                print(f"| {setup} | {engine} | failed | | | |")
                continue
            med = lambda k: statistics.median(r[k] for r in ok)  # noqa: E731
            print(f"| {setup} | {engine} | {med('step_s_median'):.3f} | {med('peak_rss_gb'):.2f} | "
                  f"{med('startup_s'):.1f} | {med('wall_s'):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
