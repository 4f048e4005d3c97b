"""SFT alone against SFT + RL on the shop (ShopSimulator, arXiv 2601.18225: SFT + RL gives significant gains),
over seeds, on held-out users, with 95% Student-t intervals and the failure-type breakdown.

For each seed s: `credo run recipes/shop.yaml OVERRIDES run.seed=s` (the warm-up is cached and shared: the recipe
fixes sft.seed), then both policies play the same `--episodes` held-out users (env seeds 10^10 + i) through the
multi-turn source exactly as its evaluator does (evaluate.py), at run.eval_temperature with run.seed=s's sampling
seeds:
    sft   the cached warm-up the run started from (its seeds differ only in those sampling seeds)
    rl    the run's final/ policy
Each (arm, seed) is one JSON line of `--out` (commit, date, overrides, every metric); a row already in `--out`
with the same arm, seed and overrides is kept, not re-run. The table (markdown) goes to stdout.

`--warmup-per-seed` gives each seed its own warm-up (`sft.seed=s`, trained by the seed's first RL run and shared
by its arms), so warm-up variance is inside the intervals; its rows record `sft.seed=s` among their overrides.
(`credo ablate recipes/ablations/shop.yaml` does the same with the run's own eval/shop/* metrics.)

    nice -n 10 python benchmarks/shop_reproduction.py --seeds 0 1 2 3 4 --episodes 128 \\
        --out docs/results/shop_sft_vs_rl.jsonl -- sft.steps=200 sft.batch_size=32 run.steps=20 run.eval_every=0
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from credo.ablate.stats import mean_ci, welch_diff  # noqa: E402

RECIPE = "recipes/shop.yaml"
METRICS = ["shop/success", "shop/attr_match", "eval/return", "shop/bought", "shop/fail_search_depth",
           "shop/fail_personalisation", "shop/fail_engagement", "shop/fail_format", "shop/turns", "shop/asks",
           "shop/invalid_calls"]
"""The table's rows: full success, attribute match, return, then the failure types (fractions of episodes)."""


def commit() -> str:
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return git.stdout.strip()


def train(arm: str, seed: int, overrides: list[str], runs: Path) -> Path:
    """The seed's RL run of `arm` (skipped when its final/ exists); returns the run folder."""
    run_dir = runs / f"{arm}_s{seed}"
    if not (run_dir / "final").is_dir():
        cmd = [sys.executable, "-m", "credo.cli", "run", RECIPE, *overrides, f"run.seed={seed}",
               f"run.output_dir={run_dir}"]
        with open(runs / f"{arm}_s{seed}.log", "a") as log:
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    return run_dir


def warmup_dir(overrides: list[str]) -> str:
    """The cached warm-up folder of the recipe with `overrides` (the one its runs started from)."""
    from credo.config import load_recipe
    from credo.models import cache_root, resolve_model_path
    from credo.sft import sft_cache_key

    r = load_recipe(str(ROOT / RECIPE), overrides)
    folder = cache_root() / "sft" / sft_cache_key(r, resolve_model_path(r.model.path, r.model.tiny))
    if not folder.is_dir():
        raise SystemExit(f"no cached warm-up at {folder}: run a seed first")
    return str(folder)


def evaluate(arm: str, model: str, seed: int, overrides: list[str], arm_overrides: list[str], episodes: int) -> dict:
    from credo.families.multiturn.envs.shop.evaluate import evaluate_model

    metrics = evaluate_model(str(ROOT / RECIPE), model, episodes, [*overrides, f"run.seed={seed}"])
    return {"arm": arm, "seed": seed, "episodes": episodes, "overrides": overrides, "arm_overrides": arm_overrides,
            "model": model,
            "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "metrics": metrics}


def table(rows: list[dict]) -> str:
    """Mean [95% CI] per arm and each RL arm - SFT (Welch) per metric."""
    arms = list(dict.fromkeys(r["arm"] for r in rows if r["arm"] != "sft"))
    by_arm = {a: [r["metrics"] for r in rows if r["arm"] == a] for a in ["sft", *arms]}
    head = " | ".join(f"SFT + {a} (n={len(by_arm[a])}) | {a} - SFT [95% CI] | p" for a in arms)
    out = [f"| metric | SFT only (n={len(by_arm['sft'])}) | {head} |", "|---|---|" + "---|---|---|" * len(arms)]
    for key in METRICS:
        sft = [m[key] for m in by_arm["sft"] if key in m]
        a = mean_ci(sft)
        cells = [f"{a.mean:.3f} [{a.low:.3f}, {a.high:.3f}]"]
        for arm in arms:
            rl = [m[key] for m in by_arm[arm] if key in m]
            b, d = mean_ci(rl), welch_diff(rl, sft)
            cells += [f"{b.mean:.3f} [{b.low:.3f}, {b.high:.3f}]", f"{d.diff:+.3f} [{d.low:+.3f}, {d.high:+.3f}]",
                      f"{d.p:.2g}"]
        out.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--episodes", type=int, default=128, help="held-out users per evaluation")
    p.add_argument("--out", default="docs/results/shop_sft_vs_rl.jsonl")
    p.add_argument("--runs", default="/tmp/shop_reproduction", help="where the RL runs go")
    p.add_argument("--arms", nargs="+", default=["sft", "rl"],
                   help="what to evaluate: sft (the cached warm-up) and RL arms (trained first); an RL arm other than "
                        "'rl' needs --arm-overrides")
    p.add_argument("--arm-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides of the RL arms' training only (e.g. IPA's), after the shared ones")
    p.add_argument("--warmup-per-seed", action="store_true",
                   help="each seed its own warm-up (sft.seed = the seed), shared by its arms; "
                        "default: the recipe's one")
    p.add_argument("--table-only", action="store_true", help="print the table of --out and stop")
    p.add_argument("overrides", nargs="*", help="recipe overrides, key=value (after --)")
    a = p.parse_args(argv)
    out, runs = ROOT / a.out, Path(a.runs) / ("warmup_per_seed" if a.warmup_per_seed else "")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    if not a.table_only:
        runs.mkdir(parents=True, exist_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        for seed in a.seeds:
            shared = [*a.overrides, f"sft.seed={seed}"] if a.warmup_per_seed else a.overrides
            done = {(r["arm"], r["seed"]) for r in rows if r["overrides"] == shared}
            # the warm-up (arm sft) is evaluated after the seed's RL runs, which train and cache it
            for arm in sorted(a.arms, key=lambda x: x == "sft"):
                if (arm, seed) not in done:
                    extra = [] if arm == "sft" else a.arm_overrides
                    model = warmup_dir(shared) if arm == "sft" else \
                        str(train(arm, seed, [*shared, *extra], runs) / "final")
                    rows.append(evaluate(arm, model, seed, shared, extra, a.episodes))
                    with open(out, "a") as f:
                        f.write(json.dumps(rows[-1], sort_keys=True) + "\n")
                    print(arm, seed, json.dumps({k: rows[-1]["metrics"].get(k) for k in METRICS[:3]}), flush=True)
    seeded = lambda r: [o for o in r["overrides"] if not o.startswith("sft.seed=")] == a.overrides \
        and (f"sft.seed={r['seed']}" in r["overrides"]) == a.warmup_per_seed
    print(table([r for r in rows if seeded(r)]))


if __name__ == "__main__":
    main()
