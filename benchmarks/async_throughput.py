"""Asynchronous training against synchronous, in the same run (docs/async.md, issue 31's speed figures).

    python benchmarks/async_throughput.py rlvr [--steps 12] [--warmup 2] [--rounds 1]
    python benchmarks/async_throughput.py multiturn [--steps 6] [--warmup 1] [--rounds 1]

`rlvr`: recipes/async.yaml (the quickstart's GRPO phase after its cached warm-up) four ways, one run at a time and
in alternating order (sync, sync_1thread, overlap S=1, overlap S=2, then reversed, ...) so a change in the
machine's load falls on all of them alike:

- sync: rollout.max_staleness 0, the trainer with every core (run.threads = the machine's cores);
- sync_1thread: the same on one thread, the thread count of each overlap process (so the ratio against it is the
  overlap alone, not a change in threads);
- overlap S = 1 and S = 2: one rollout worker process and the trainer, each with half the cores.

Per run, over the steps after --warmup: the median `perf/step_time_s` (rollout to weight sync: in overlap the
trainer's wait for the workers is inside it), tokens/s (the sum of tokens over the sum of step times), the median
rollout / log-prob / update seconds of a step, and the mean `async/trainer_idle_frac` / `async/rollout_idle_frac`.
The ratio is the first variant's median step time over the variant's.

`longtail`: recipes/longtail.yaml (answers of 12 to 252 tokens, rollout most of a synchronous step), issue 52's levers
one by one on equal cores: sync on every core and on one thread; overlap S = 1; + partial rollout; + algo.old_log_probs:
rollout (no pi_old recompute); and the three with per-prompt dispatch (request_prompts 1). The ratio is tokens/s over
the first variant's (answer lengths differ between runs).

`multiturn`: recipes/async_multiturn.yaml (GuessNumber with simulated log-normal env step latency, median
env.kwargs.latency_s, sigma env.kwargs.latency_sigma) with env.trajectory_async true against false, synchronous
(max_staleness 0) so that only the episode loop differs; `perf/episodes_per_s` (episodes over the wall time of the
multi-turn source's run_episodes) per step, its median, and the ratio trajectory-level / turn-synchronous.

Each run is `credo run` in a subprocess with the repository on PYTHONPATH; rows go to --out as JSON lines (with the
commit, date and load average) and a table is printed.
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

RLVR = {
    "sync": ["rollout.max_staleness=0", f"run.threads={os.cpu_count() or 1}"],
    "sync_1thread": ["rollout.max_staleness=0", "run.threads=1"],
    "overlap_S1": ["rollout.max_staleness=1", "rollout.async_mode=overlap", "run.threads=1"],
    "overlap_S2": ["rollout.max_staleness=2", "rollout.async_mode=overlap", "run.threads=1"],
}
OVERLAP = "stages.schedule=overlap"
LONGTAIL = {  # issue 52's speed table: each lever of the asynchronous step on equal cores
    "sync": [f"run.threads={os.cpu_count() or 1}"],
    "sync_1thread": ["run.threads=1"],
    "overlap": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1}", "run.threads=1"],
    "overlap_partial": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, partial_rollout: true}", "run.threads=1"],
    "overlap_partial_mu": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, partial_rollout: true}",
                           "algo.old_log_probs=rollout", "run.threads=1"],
    # the worker on both cores (oversubscribed while the trainer updates, which it does a fraction of the step)
    "overlap_partial_mu_2w": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, partial_rollout: true, "
                              "worker_threads: 2}", "algo.old_log_probs=rollout", "run.threads=1"],
    "overlap_mu_2w": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, worker_threads: 2}",
                      "algo.old_log_probs=rollout", "run.threads=1"],
    # per-prompt dispatch (request_prompts 1): a group returns as soon as its own responses end, not at the
    # batch's longest (ROLL Flash's answer to the long tail inside the overlap schedule)
    "overlap_early": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, request_prompts: 1}", "run.threads=1"],
    "overlap_partial_early": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, partial_rollout: true, "
                              "request_prompts: 1}", "run.threads=1"],
    "overlap_partial_mu_early": [OVERLAP, "stages.schedule_kwargs={max_staleness: 1, partial_rollout: true, "
                                 "request_prompts: 1}", "algo.old_log_probs=rollout", "run.threads=1"],
}
MULTITURN = {
    "turn_sync": ["env.trajectory_async=false"],
    "trajectory": ["env.trajectory_async=true"],
}


def run_one(recipe: str, overrides: list[str], out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "credo.cli", "run", str(REPO / recipe), f"run.output_dir={out}", "run.progress=false",
           "run.plot=false", "run.eval_every=0", "run.save_every=0", *overrides]
    done = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def summarize(rows: list[dict], warmup: int) -> dict:
    steps = [r for r in rows if r.get("step", 0) > warmup and "perf/step_time_s" in r]
    mean = lambda key: statistics.fmean(r[key] for r in steps) if steps and key in steps[0] else None
    times = [r["perf/step_time_s"] for r in steps]
    tokens = sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in steps)
    phase = lambda key: statistics.median(r[key] for r in steps) if steps and key in steps[0] else None
    out = {"steps": len(steps), "step_time_median_s": statistics.median(times), "tokens_per_s": tokens / sum(times),
           "rollout_median_s": phase("perf/rollout_s"), "logprob_median_s": phase("perf/logprob_s"),
           "update_median_s": phase("perf/update_s"),
           "trainer_idle_frac": mean("async/trainer_idle_frac"), "rollout_idle_frac": mean("async/rollout_idle_frac"),
           "staleness_mean": mean("async/staleness_mean"), "dropped_stale": mean("async/dropped_stale")}
    if steps and "perf/episodes_per_s" in steps[0]:
        eps = [r["perf/episodes_per_s"] for r in steps]
        out.update({"episodes_per_s": eps, "episodes_per_s_median": statistics.median(eps),
                    "turns_per_episode": mean("env/turns_mean")})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["rlvr", "longtail", "multiturn"])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None, help="first steps left out (start-up costs)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON lines of the runs (default: print only)")
    p.add_argument("--variants", nargs="+", default=None,
                   help="a subset of the variants, in this order (the first is the ratio's baseline)")
    p.add_argument("extra", nargs="*", help="overrides for every run")
    args = p.parse_intermixed_args()  # overrides after the options (parse_args leaves them unrecognised)
    recipe, variants = {"rlvr": ("recipes/async.yaml", RLVR), "longtail": ("recipes/longtail.yaml", LONGTAIL),
                        "multiturn": ("recipes/async_multiturn.yaml", MULTITURN)}[args.what]
    steps = args.steps or (6 if args.what == "multiturn" else 12)
    warmup = args.warmup if args.warmup is not None else (1 if args.what == "multiturn" else 2)
    base = [f"run.steps={steps}"] + (["rollout.max_staleness=0"] if args.what == "multiturn" else [])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="credo-async-bench-"))
    names = args.variants or list(variants)
    unknown = [v for v in names if v not in variants]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown} for {args.what}; known: {list(variants)}")
    results: dict[str, list[dict]] = {v: [] for v in names}
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            t = time.time()
            rows = run_one(recipe, [*base, *variants[name], *args.extra], tmp / f"{name}-{rnd}")
            s = summarize(rows, warmup)
            s.update({"variant": name, "round": rnd, "recipe": recipe,
                      "overrides": [*base, *variants[name], *args.extra],
                      "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "loadavg_1m": os.getloadavg()[0], "wall_s": time.time() - t})
            results[name].append(s)
            print(json.dumps({k: v for k, v in s.items() if k != "episodes_per_s"}), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            for rows in results.values():
                f.writelines(json.dumps(s) + "\n" for s in rows)
    baseline = names[0]
    med = lambda name, key: statistics.median(s[key] for s in results[name])
    key = {"rlvr": "step_time_median_s", "longtail": "tokens_per_s",
           "multiturn": "episodes_per_s_median"}[args.what]
    print(f"\n{'variant':12s} {key:>22s} {'ratio':>7s} {'tokens/s':>9s} {'trainer idle':>12s} {'rollout idle':>12s}")
    for name in names:
        ratio = med(baseline, key) / med(name, key) if args.what == "rlvr" else med(name, key) / med(baseline, key)
        idle = lambda k: "-" if results[name][0][k] is None else f"{statistics.fmean(s[k] for s in results[name]):.2f}"
        print(f"{name:12s} {med(name, key):22.3f} {ratio:7.2f} {med(name, 'tokens_per_s'):9.0f} "
              f"{idle('trainer_idle_frac'):>12s} {idle('rollout_idle_frac'):>12s}")


if __name__ == "__main__":
    main()
