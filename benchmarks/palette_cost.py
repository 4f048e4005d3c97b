"""Step time and peak memory of Reasoning Palette's prefixes against the same recipe without them.

    nice -n 10 python benchmarks/palette_cost.py --steps 12 --rounds 2

Runs recipes/palette.yaml (evaluation and checkpoints off) with palette.enabled true and false, `rounds` times each,
alternating, one `credo run` process per run (so each peak RSS is its own), and prints per variant the median of
perf/step_time_s and of its stages over the steps after the first (which warms caches), the peak RSS, and the
ratios. Both variants log the diversity metrics (palette.diversity_metrics), so the hook's cost is on both sides;
the difference is the latent draws, the decoder, and the k prefix positions in the rollout and in every trainer
forward. Extra `key=value` arguments override the recipe (e.g. palette.prefix_len=16). Warm-ups are cached
(CREDO_CACHE) before the timed runs.
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
KEYS = ("perf/step_time_s", "perf/rollout_s", "perf/logprob_s", "perf/update_s", "perf/palette_s")


def run(out: Path, steps: int, overrides: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "credo.cli", "run", str(REPO / "recipes" / "palette.yaml"), f"run.output_dir={out}",
           f"run.steps={steps}", "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false",
           "palette.diversity_metrics=true", *overrides]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"run failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-palette-cost-"))
    variants = {"GRPO (no prefix)": ["palette.enabled=false"], "Reasoning Palette": ["palette.enabled=true"]}
    for name, over in variants.items():  # warm the caches (credo's and the palette warm-up) outside the timing
        run(tmp / f"warm-{len(name)}", 1, [*over, *args.overrides])
    stats: dict[str, dict[str, list[float]]] = {n: {k: [] for k in (*KEYS, "rss")} for n in variants}
    for i in range(args.rounds):
        for j, (name, over) in enumerate(variants.items()):
            rows = run(tmp / f"{i}-{j}", args.steps, [*over, *args.overrides])
            for k in KEYS:
                stats[name][k] += [r.get(k, 0.0) for r in rows[1:]]
            stats[name]["rss"].append(max(r["perf/peak_rss_gb"] for r in rows))
    base = None
    for name, s in stats.items():
        med = {k: statistics.median(v) for k, v in s.items() if k != "rss"}
        rss = max(s["rss"])
        ratio = "" if base is None else (f"  step x{med['perf/step_time_s'] / base[0]:.2f}, "
                                         f"peak RSS x{rss / base[1]:.2f}")
        print(f"{name}: " + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in med.items())
              + f", peak RSS {rss:.2f} GB{ratio}")
        base = base or (med["perf/step_time_s"], rss)


if __name__ == "__main__":
    main()
