"""Predict issue 52's long-tail variants with `credo simulate` and set them beside docs/async.md's measurement.

    python benchmarks/simulate/predict_longtail_async.py [--steps 200] [--seeds 5] [--write-scenario]

The costs (docs/simulate.md, "Partial rollout on this machine: predicted against measured"):

- Shape: the long-tail calibration (benchmarks/simulate/measured/costs_longtail_cpu.yaml, a loaded machine,
  2026-12-03): decode_step_s and decode_ctx_s (their ratio), train_token_s; and the lengths fitted to the recipe's
  rollouts (longtail_cpu.yaml's log-normal).
- Level: two scale factors per thread count, one for rollout and one for training, set so that the simulated
  synchronous step's median rollout and training seconds equal the measured ones of the quiet runs of
  docs/results/async_longtail.jsonl (`sync` on 2 threads, `sync_1thread` on 1). Only the two synchronous variants
  are read for this; the asynchronous ones are predicted.
- Assumed, not measured: a forward pass costs a third of the update's forward + backward per token, for the
  trainer's pi_old recompute (logprob_token_s) and for a prefill (prefill_token_s: the first prompt and partial
  rollout's re-read of prompt + response so far); reward 0 (the quiet synchronous steps equal rollout + pi_old +
  update to 0.01 s); weight sync as calibrated (2e-5 s).
- The machine: 2 cores. A synchronous run is one device with the 2-thread (or 1-thread) costs. Overlap is one
  rollout device (the worker process, 1 thread) and one train device (the trainer, 1 thread), each with the
  1-thread costs: the model assumes the two processes do not slow each other. The worker is credo's hf overlap
  worker (engine static in mode async: a request is one generate call of max_batch rows, 64 = a step's 16
  prompts x 4, or 4 with request_prompts 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from credo.simulate.runner import simulate, simulate_mode
from credo.simulate.scenario import scenario_from_dict

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "docs/results/async_longtail.jsonl"
BASE_COSTS = REPO / "benchmarks/simulate/measured/costs_longtail_cpu.yaml"
LENGTHS = {"kind": "lognormal", "median": 31, "sigma_prompt": 0.43, "sigma_response": 0.61, "min_len": 1,
           "max_len": 260, "prompt_len": 11}  # longtail_cpu.yaml: fitted to the recipe's rollouts
P, G = 16, 4
ASYNC = {"mode": "async", "placement": "disaggregated", "rollout_devices": 1, "train_devices": 1, "staleness": 1,
         "engine": "static"}
# (name, the measured variant of docs/results/async_longtail.jsonl, the mode beside the costs)
VARIANTS = [
    ("sync", "sync", {"mode": "sync", "devices": 1, "engine": "static", "max_batch": 0, "old_log_probs": "rollout"}),
    ("sync_1thread", "sync_1thread", {"mode": "sync", "devices": 1, "engine": "static", "max_batch": 0,
                                      "old_log_probs": "rollout"}),
    ("overlap", "overlap", {**ASYNC, "max_batch": P * G}),
    ("overlap_partial", "overlap_partial", {**ASYNC, "max_batch": P * G, "partial_rollout": True}),
    ("overlap_partial_mu", "overlap_partial_mu", {**ASYNC, "max_batch": P * G, "partial_rollout": True,
                                                  "old_log_probs": "rollout"}),
    ("overlap_early", "overlap_early", {**ASYNC, "max_batch": G}),
    ("overlap_partial_early", "overlap_partial_early", {**ASYNC, "max_batch": G, "partial_rollout": True}),
    ("overlap_partial_mu_early", "overlap_partial_mu_early", {**ASYNC, "max_batch": G, "partial_rollout": True,
                                                              "old_log_probs": "rollout"}),
]


def measured() -> dict:
    """Per variant: the median of its runs (docs/async.md's table) of tokens/s, step, rollout, pi_old, update."""
    runs: dict = {}
    for line in MEASURED.read_text().splitlines():
        row = json.loads(line)
        runs.setdefault(row["variant"], []).append(row)
    keys = ("tokens_per_s", "step_time_median_s", "rollout_median_s", "logprob_median_s", "update_median_s")
    return {v: {k: statistics.median(r[k] for r in rows) for k in keys} | {"runs": [r["tokens_per_s"] for r in rows]}
            for v, rows in runs.items()}


def _median_phases(costs: dict, steps: int, seed: int = 0) -> tuple[float, float]:
    scn = scenario_from_dict({"steps": steps, "seed": seed, "costs": costs, "modes": [VARIANTS[0][2]],
                              "workload": {"prompts_per_step": P, "group_size": G, "lengths": LENGTHS}})
    res, _ = simulate_mode(scn, scn.modes[0])
    return (statistics.median(r.rollout_s for r in res.records), statistics.median(r.train_s for r in res.records))


def costs_for(sync_row: dict, steps: int) -> dict:
    """The calibration's cost shape scaled to a quiet synchronous run's median rollout and training seconds."""
    base = (yaml.safe_load(BASE_COSTS.read_text()) or {})["costs"]
    c = {"decode_step_s": base["decode_step_s"], "decode_ctx_s": base["decode_ctx_s"],
         "train_token_s": base["train_token_s"], "sync_s": base["sync_s"], "reward_sample_s": 0.0}
    # training: linear in train_token_s (train_fixed_s 0), so one simulation gives the factor
    _, train = _median_phases(c, steps)
    c["train_token_s"] *= (sync_row["update_median_s"] + sync_row["logprob_median_s"]) / train
    forward = c["train_token_s"] / 3  # assumed: a forward is a third of forward + backward
    c["logprob_token_s"] = c["prefill_token_s"] = forward
    # rollout: prefill (fixed by the assumption above) + decode x a; bisect a on the median
    lo, hi = 0.0, 1.0
    while _median_phases({**c, "decode_step_s": c["decode_step_s"] * hi, "decode_ctx_s": c["decode_ctx_s"] * hi},
                         steps)[0] < sync_row["rollout_median_s"]:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        roll = _median_phases({**c, "decode_step_s": c["decode_step_s"] * mid, "decode_ctx_s": c["decode_ctx_s"] * mid},
                              steps)[0]
        lo, hi = (mid, hi) if roll < sync_row["rollout_median_s"] else (lo, mid)
    c["decode_step_s"] *= hi
    c["decode_ctx_s"] *= hi
    return {k: float(f"{v:.4g}") for k, v in c.items()}


def scenario(meas: dict, steps: int) -> dict:
    one, two = costs_for(meas["sync_1thread"], steps), costs_for(meas["sync"], steps)
    modes = []
    for name, _, mode in VARIANTS:
        modes.append({"name": name, **mode} | ({"costs": two} if name == "sync" else {}))
    return {"name": "longtail-async-cpu",
            "source": "recipes/longtail.yaml on this 2-core machine, issue 52's variants (docs/async.md, 'Measured on "
                      "a quiet machine: issue 52's levers'); costs from benchmarks/simulate/predict_longtail_async.py: "
                      "the long-tail calibration's shape scaled to the quiet synchronous runs (1 thread: the default "
                      "costs; 2 threads: the sync mode's own), a forward a third of forward + backward (assumed)",
            "steps": steps, "seed": 0, "baseline": "sync",
            "workload": {"prompts_per_step": P, "group_size": G, "train_padding": "padded", "lengths": LENGTHS},
            "costs": one, "modes": modes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--write-scenario", action="store_true", help="write benchmarks/simulate/longtail_async_cpu.yaml")
    args = p.parse_args()
    meas = measured()
    raw = scenario(meas, args.steps)
    if args.write_scenario:
        out = REPO / "benchmarks/simulate/longtail_async_cpu.yaml"
        out.write_text("# written by benchmarks/simulate/predict_longtail_async.py --write-scenario\n"
                       + yaml.safe_dump(raw, sort_keys=False, width=118))
        print(f"wrote {out}")
    print("costs, 1 thread:", raw["costs"])
    print("costs, 2 threads (sync):", raw["modes"][0]["costs"])
    per_seed = [simulate(scenario_from_dict({**raw, "seed": s})) for s in range(args.seeds)]
    base = statistics.mean(res[0].tokens_per_s for res in per_seed)
    base_m = meas["sync"]["tokens_per_s"]
    print(f"\nPredicted: {args.seeds} seeds x {args.steps} steps (means); measured: docs/results/async_longtail.jsonl "
          "(medians of the runs). Phases: the trainer's wait for a batch (sync: the rollout) / pi_old / update.\n")
    print("| variant | measured tokens/s [runs] | measured vs sync | predicted tokens/s | predicted vs sync | "
          "measured step (s) | predicted step (s) | measured phases (s) | predicted phases (s) | "
          "predicted interrupted share, version span mean (max) |")
    print("|" + "---|" * 10)
    pred = {}
    for i, (name, key, _) in enumerate(VARIANTS):
        rs = [res[i] for res in per_seed]
        tps = statistics.mean(r.tokens_per_s for r in rs)
        lp = statistics.mean(statistics.mean(x.logprob_s for x in r.records) for r in rs)
        train = statistics.mean(r.train_s for r in rs)
        pred[name] = {"update": train - lp, "pi_old": lp}
        m = meas.get(key)
        if m:
            mcols = (f"{m['tokens_per_s']:.0f} [{', '.join(f'{x:.0f}' for x in m['runs'])}] | "
                     f"{m['tokens_per_s'] / base_m:.2f}")
            mstep = f"{m['step_time_median_s']:.2f}"
            mph = f"{m['rollout_median_s']:.2f} / {m['logprob_median_s']:.3f} / {m['update_median_s']:.2f}"
        else:
            mcols, mstep, mph = "not measured | ", "", ""
        inter = ""
        if "interrupted_frac" in rs[0].stats:
            inter = (f"{statistics.mean(r.stats['interrupted_frac'] for r in rs):.3f}, "
                     f"{statistics.mean(r.stats['version_span_mean'] for r in rs):.3f} "
                     f"({max(r.stats['version_span_max'] for r in rs)})")
        print(f"| {name} | {mcols} | {tps:.0f} | {tps / base:.2f} | {mstep} | "
              f"{statistics.mean(r.step_time_s for r in rs):.2f} | {mph} | "
              f"{statistics.mean(r.rollout_s for r in rs):.2f} / {lp:.3f} / {train - lp:.2f} | {inter} |")
    # Not a prediction: the partial variants with the trainer's measured pi_old and update seconds as its costs
    print("\nDiagnosis (not a prediction): the partial variants told the trainer's measured pi_old and update times")
    print("| variant | measured vs sync | model, trainer as measured, vs sync |\n|---|---|---|")
    one = raw["costs"]
    for name in ("overlap_partial", "overlap_partial_mu"):
        i = [v[0] for v in VARIANTS].index(name)
        m = meas[name]
        over = {**one, "train_token_s": one["train_token_s"] * m["update_median_s"] / pred[name]["update"]}
        if pred[name]["pi_old"] > 0:
            over["logprob_token_s"] = one["logprob_token_s"] * m["logprob_median_s"] / pred[name]["pi_old"]
        mode = {"name": name, **VARIANTS[i][2], "costs": over}
        scns = [scenario_from_dict({**raw, "seed": s, "modes": [mode], "baseline": name}) for s in range(args.seeds)]
        rs = [simulate_mode(scn, scn.modes[0])[0] for scn in scns]
        print(f"| {name} | {m['tokens_per_s'] / base_m:.2f} | "
              f"{statistics.mean(r.tokens_per_s for r in rs) / base:.2f} |")


if __name__ == "__main__":
    main()
