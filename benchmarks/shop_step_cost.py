"""Step time and peak memory of the shop recipe against the guess-game multi-turn recipe, in the same invocation.

    nice -n 19 python benchmarks/shop_step_cost.py --warm-only -- sft.steps=20 sft.batch_size=32
    flock /work/locks/timing.lock nice -n 0 python benchmarks/shop_step_cost.py --steps 6 --rounds 2 \\
        -- sft.steps=20 sft.batch_size=32

Runs recipes/shop.yaml (the shop, `credo:Shop-v0-tiny`) and recipes/multiturn.yaml (the guess game, the same tiny
model, source, credit and loss) with evaluation and checkpoints off, `rounds` times each, alternating, one
`credo run` process per run (so each peak RSS is its own). Prints per recipe the median over the steps after the
first (which warms caches) of perf/step_time_s and its stages, perf/episodes_per_s, env/turns_mean, the peak RSS
(perf/peak_rss_gb, the process's), and the shop's ratios to the guess game. The overrides after `--` go to both
recipes (e.g. a shorter warm-up, run.threads); warm-ups are cached (CREDO_CACHE) by `--warm-only` or by the
first round's warm runs, outside the timed runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"guess game (recipes/multiturn.yaml)": "recipes/multiturn.yaml",
           "shop (recipes/shop.yaml)": "recipes/shop.yaml"}
"""Baseline first."""
KEYS = ("perf/step_time_s", "perf/rollout_s", "perf/logprob_s", "perf/update_s", "perf/episodes_per_s",
        "env/turns_mean", "train/response_len")


def run(recipe: str, out: Path, steps: int, overrides: list[str]) -> list[dict]:
    """One `credo run` of `steps` steps; its metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "credo.cli", "run", str(REPO / recipe), f"run.output_dir={out}", f"run.steps={steps}",
           "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false", *overrides]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{recipe} failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warm-only", action="store_true", help="cache both warm-ups (one 1-step run each) and stop")
    p.add_argument("overrides", nargs="*", help="overrides of both recipes, key=value (after --)")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-shop-cost-"))
    for i, recipe in enumerate(RECIPES.values()):  # warm-ups and first-import costs outside the timed runs
        run(recipe, tmp / f"warm-{i}", 1, a.overrides)
    if a.warm_only:
        return
    stats: dict[str, dict[str, list[float]]] = {n: {k: [] for k in (*KEYS, "rss")} for n in RECIPES}
    for r in range(a.rounds):
        for i, (name, recipe) in enumerate(RECIPES.items()):
            rows = run(recipe, tmp / f"{r}-{i}", a.steps, a.overrides)
            for k in KEYS:
                stats[name][k] += [row[k] for row in rows[1:] if k in row]
            stats[name]["rss"].append(max(row["perf/peak_rss_gb"] for row in rows))
    base = None
    for name, s in stats.items():
        med = {k: statistics.median(v) for k, v in s.items() if k != "rss"}
        rss = max(s["rss"])
        ratio = "" if base is None else (f"; step time x{med['perf/step_time_s'] / base[0]:.2f}, "
                                         f"peak RSS x{rss / base[1]:.2f}, "
                                         f"episodes/s x{med['perf/episodes_per_s'] / base[2]:.2f}")
        print(f"{name} ({len(s['perf/step_time_s'])} steps): "
              + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in med.items()) + f", peak RSS {rss:.3f} GB{ratio}")
        base = base or (med["perf/step_time_s"], rss, med["perf/episodes_per_s"])


if __name__ == "__main__":
    main()
