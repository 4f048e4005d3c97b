"""Step time and peak memory of training variants against a baseline, measured in the same session.

    python benchmarks/variant_cost.py --steps 30 --rounds 2
    python benchmarks/variant_cost.py --steps 4 --rounds 1 --only ... --extra model.tiny.hidden_size=512 ...

Runs each variant below (`credo run` in a subprocess, warm-ups cached, evaluation and checkpoints off)
`rounds` times, interleaved, and prints the median `perf/step_time_s`, the median of any extra stage
timer (`perf/critic_s`, `perf/credit_s`), the peak RSS, and each ratio to the baseline (the first row).
On CPU peak memory is the process's maximum resident set (`perf/peak_rss_gb`), which includes the
libraries: compare differences, not ratios, for small models.
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
SMALL_CRITIC = ["critic.path=tiny", "critic.tiny.num_layers=1", "critic.tiny.hidden_size=64", "critic.tiny.num_heads=2",
                "critic.tiny.num_kv_heads=1", "critic.tiny.intermediate_size=128",
                "critic.tiny.tie_word_embeddings=false"]
VARIANTS = {
    "grpo (quickstart)": ("recipes/quickstart.yaml", []),
    "ppo, critic = actor size": ("recipes/ppo.yaml", []),
    "ppo, small critic": ("recipes/ppo.yaml", SMALL_CRITIC),
    "asyppo, 2 small critics": ("recipes/asyppo.yaml", SMALL_CRITIC),
    "asyppo, 2 critics = actor size": ("recipes/asyppo.yaml", []),
    "grpo + attention_credit (coupled)": ("recipes/quickstart.yaml", [
        "stages.probes=[attention_credit]", "stages.probe_kwargs={attention_credit: {strategy: coupled}}"]),
    "grpo + attention_credit (flow)": ("recipes/quickstart.yaml", [
        "stages.probes=[attention_credit]", "stages.probe_kwargs={attention_credit: {strategy: flow}}"]),
    # on-policy distillation from the quickstart's warm-up: the teacher (its clean warm-up, as large as the policy)
    # scores every sampled token on the trainer before the update (docs/distill.md)
    "grpo + distill (teacher on the trainer)": ("recipes/distill.yaml", []),
    # truncated sampling (docs/truncated_sampling.md): top_k 5 alone, then with the trainer's log-probs over the
    # sampler's kept sets (the sampler records a threshold per token; the trainer masks each logits chunk)
    "grpo, top_k 5": ("recipes/quickstart.yaml", ["rollout.top_k=5"]),
    "grpo, top_k 5 + kept-set replay": ("recipes/quickstart.yaml", ["rollout.top_k=5", "rollout.kept_set_replay=true"]),
}


def run(recipe: str, overrides: list[str], out: Path, steps: int, threads: int = 0) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "credo.cli", "run", recipe, f"run.output_dir={out}", f"run.steps={steps}",
           "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false",
           *([f"run.threads={threads}"] if threads else []), *overrides]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    p.add_argument("--extra", nargs="*", default=[], help="overrides appended to every variant (e.g. a wider model, "
                   "so that model states dominate the resident set)")
    p.add_argument("--threads", type=int, default=0,
                   help="run.threads for every variant (0: the recipe's default); 1 is steadier on a shared CPU")
    args = p.parse_args()
    names = [n for n in VARIANTS if not args.only or n in args.only]
    tmp = Path(tempfile.mkdtemp(prefix="credo-variants-"))
    step, extra, rss = {n: [] for n in names}, {n: {} for n in names}, {n: [] for n in names}
    for i in range(args.rounds):
        for j, name in enumerate(names):
            recipe, overrides = VARIANTS[name]
            rows = [r for r in run(recipe, [*overrides, *args.extra], tmp / f"{i}-{j}", args.steps, args.threads)
                    if "perf/step_time_s" in r]
            rows = rows[2:] or rows  # the first steps warm caches (and critic-only steps skip the update)
            step[name].append(statistics.median(r["perf/step_time_s"] for r in rows))
            for key in ("perf/critic_s", "perf/credit_s", "perf/distill_teacher_s"):
                if key in rows[0]:
                    extra[name].setdefault(key, []).append(statistics.median(r[key] for r in rows))
            rss[name].append(max(r["perf/peak_rss_gb"] for r in rows))
            print(f"round {i} {name}: median step {step[name][-1]:.4f} s, peak RSS {rss[name][-1]:.3f} GB, load "
                  f"average {os.getloadavg()[0]:.1f}", flush=True)
    base = statistics.median(step[names[0]])
    base_rss = statistics.median(rss[names[0]])
    print(f"\n| variant | median step (s) | vs {names[0]} | stage timer (s) | peak RSS (GB) | RSS - baseline (GB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        s, m = statistics.median(step[name]), statistics.median(rss[name])
        timers = ", ".join(f"{k.split('/')[1]} {statistics.median(v):.4f}" for k, v in extra[name].items()) or "-"
        print(f"| {name} | {s:.4f} | {s / base:.2f}x | {timers} | {m:.2f} | {m - base_rss:+.2f} |")


if __name__ == "__main__":
    main()
