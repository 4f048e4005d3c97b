"""Measure this machine's costs for a recipe's model, apart from any run the simulator is validated on.

- Decode and prefill (`decode_from="run"`, the default): a calibration run's perf/rollout_s per step, with the
  step's generate calls (B rows, P prompt width, L the longest response, from its dump), fitted to the model
  below. This is exact for the calibration run's batch size, and the calibration run can run at the same time as
  the validated one, so a shared machine's load is the same for both (a grid timed at another moment is not).
- Decode and prefill (`decode_from="grid"`): the recipe's rollout engine (today the hf backend,
  credo.distributed.rollout.HFBackend) timed on a grid of batch sizes B and response lengths L with lengths
  forced (EOS suppressed until L); this separates the batch dependence, for extrapolating to other B. Both fit

      t(B, L) = prefill_s + prefill_token_s * B * P + L * (decode_step_s + decode_seq_s * B)
                + decode_ctx_s * (B * P * L + B * L * (L - 1) / 2)

  is fitted by non-negative least squares (P: the task's longest prompt in the batch).
- Train, reward and sync: regressed from a short calibration run's `perf/*` metrics (a run of its own, not the
  one being validated): perf/logprob_s + perf/update_s against the padded tokens of the step (rows x longest
  row, read from the step's rollout dump), perf/reward_s per sample, perf/sync_s as is. With the grid, the
  calibration run's rollout time beyond what the grid predicts (prompt rendering, bookkeeping) is added to
  prefill_s as a per-call overhead.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import yaml

from credo.simulate.costs import Costs, chunk_time, prefill_time


def _features(b: int, p: int, length: int) -> list[float]:
    return [1.0, b * p, length, length * b, b * p * length + b * length * (length - 1) / 2]


def measure_generate(recipe_path: str, repeats: int = 3, overrides: list[str] | None = None) -> tuple[list[tuple], int]:
    """(B, P, L, seconds) on a grid, timed through the recipe's hf backend; and P."""
    import os

    import torch
    from credo.config import load_recipe
    from credo.distributed.rollout import HFBackend
    from credo.models import load_causal_lm, load_tokenizer, resolve_model_path
    from credo.tasks import make_task

    r = load_recipe(recipe_path, list(overrides or []))
    torch.set_num_threads(r.run.threads or max(1, os.cpu_count() or 1))  # as the trainer sets them
    if r.rollout.backend != "hf":
        raise ValueError(f"{recipe_path}: rollout.backend = {r.rollout.backend}; calibrate times the hf backend only")
    path = resolve_model_path(r.model.path, r.model.tiny)  # the weights do not change the time of a step
    tok, model = load_tokenizer(path), load_causal_lm(path, r.model.dtype)
    backend = HFBackend(model, tok, max_batch=r.rollout.hf_max_batch)
    task = make_task(r.task)
    prompts = [tok(task.train(i).prompt)["input_ids"] for i in range(2048)]
    torch.manual_seed(0)
    b_run = r.rollout.prompts_per_step * r.rollout.group_size
    if r.rollout.hf_max_batch:
        b_run = min(b_run, r.rollout.hf_max_batch)
    cap = r.rollout.max_new_tokens
    grid = [(b, n) for b in sorted({max(1, b_run // 4), max(1, b_run // 2), b_run})
            for n in sorted({max(1, cap // 8), max(1, cap // 2), cap})]
    rows, width = [], 0
    for b, n in grid:
        batch = prompts[:b]
        width = max(width, max(len(p) for p in batch))
        cfg = backend._generation_config(n, r.rollout.temperature, r.rollout.top_p, greedy=False)
        cfg.min_new_tokens = n  # force L tokens: the grid point, not the model's own stopping
        times = []
        for rep in range(repeats + 1):
            t0 = time.perf_counter()
            backend.generate(batch, max_new_tokens=n, temperature=r.rollout.temperature, top_p=r.rollout.top_p,
                             seeds=list(range(rep * b, rep * b + b)))
            if rep:  # the first call warms up
                times.append(time.perf_counter() - t0)
        rows.append((b, max(len(p) for p in batch), n, statistics.median(times)))
    return rows, width


def fit_decode(rows: list[tuple]) -> dict:
    """Non-negative least squares of t(B, L) over the grid (see the module docstring)."""
    from scipy.optimize import nnls

    a = np.array([_features(b, p, n) for b, p, n, _ in rows])
    y = np.array([t for *_, t in rows])
    scale = np.maximum(a.max(0), 1e-12)
    coef, _ = nnls(a / scale, y)
    coef = coef / scale
    keys = ["prefill_s", "prefill_token_s", "decode_step_s", "decode_seq_s", "decode_ctx_s"]
    return {k: float(v) for k, v in zip(keys, coef)}


def read_run(run_dir: str | Path) -> list[dict]:
    """Per step: the metrics row and the dump's (prompt_len, response_len) pairs, for steps that have both."""
    run_dir = Path(run_dir)
    mpath = run_dir / "metrics.jsonl"
    if not mpath.exists():
        raise FileNotFoundError(f"{mpath} does not exist: expected a credo run folder")
    rows = {}
    for line in mpath.read_text().splitlines():
        row = json.loads(line)
        if "perf/step_time_s" in row:
            rows[row["step"]] = row
    steps = []
    for step, row in sorted(rows.items()):
        dump = run_dir / "rollouts" / f"step_{step}.jsonl"
        if not dump.exists():
            continue
        pairs = [(len(d["prompt_ids"]), len(d["response_ids"])) for d in map(json.loads, dump.read_text().splitlines())]
        steps.append({"step": step, "metrics": row, "pairs": pairs})
    if not steps:
        raise ValueError(f"{run_dir}: no step has both perf/* metrics and a rollout dump (set run.dump_rollouts_every: 1)")
    return steps


def fit_train(steps: list[dict], skip_first: bool = True) -> dict:
    """train_fixed_s, train_token_s, reward_sample_s and sync_s from a calibration run's steps."""
    use = [s for s in steps if not (skip_first and s["step"] == 1)] or steps
    x = np.array([len(s["pairs"]) * max(p + n for p, n in s["pairs"]) for s in use], dtype=float)
    y = np.array([s["metrics"]["perf/logprob_s"] + s["metrics"]["perf/update_s"] for s in use])
    if len(set(x)) > 1:
        slope, icpt = np.polyfit(x, y, 1)
        if slope < 0:  # noise: fall back to the mean cost per token
            slope, icpt = float(y.sum() / x.sum()), 0.0
        if icpt < 0:
            slope, icpt = float((y / x).mean()), 0.0
    else:
        slope, icpt = float((y / x).mean()), 0.0
    reward = [s["metrics"]["perf/reward_s"] / len(s["pairs"]) for s in use]
    sync = [s["metrics"]["perf/sync_s"] for s in use]
    return {"train_fixed_s": float(icpt), "train_token_s": float(slope), "reward_sample_s": float(np.mean(reward)),
            "sync_s": float(np.mean(sync))}


def run_decode_rows(steps: list[dict], max_batch: int, skip_first: bool = True) -> list[tuple]:
    """(B, P, L, seconds) per step of a run whose steps are one generate call each (hf_max_batch 0 or >= B)."""
    rows = []
    for s in steps:
        if skip_first and s["step"] == 1:
            continue
        pairs = s["pairs"]
        if max_batch and len(pairs) > max_batch:
            raise ValueError(f"step {s['step']} has {len(pairs)} rows in calls of {max_batch}: fit the decode costs "
                             "from a generate grid (--decode-from grid) instead")
        rows.append((len(pairs), max(p for p, _ in pairs), max(n for _, n in pairs), s["metrics"]["perf/rollout_s"]))
    return rows


def rollout_overhead(steps: list[dict], decode: dict, max_batch: int, skip_first: bool = True) -> float:
    """Median seconds of a calibration run's rollout beyond the generate calls the fitted costs predict."""
    c = Costs(**decode)
    resid = []
    for s in steps:
        if skip_first and s["step"] == 1:
            continue
        pairs = s["pairs"]
        block = max_batch or len(pairs)
        pred = 0.0
        for i in range(0, len(pairs), block):
            call = pairs[i:i + block]
            width, k = max(p for p, _ in call), max(n for _, n in call)
            pred += prefill_time(c, len(call) * width) + chunk_time(c, len(call), len(call) * width, k)
        resid.append(s["metrics"]["perf/rollout_s"] - pred)
    return max(0.0, statistics.median(resid)) if resid else 0.0


def calibrate(recipe_path: str, run_dir: str, out: str, repeats: int = 3, overrides: list[str] | None = None,
              decode_from: str = "run") -> dict:
    """Fit every cost and write them as a YAML `costs:` mapping (with the data and date as comments)."""
    from credo.config import load_recipe

    r = load_recipe(recipe_path, list(overrides or []))
    steps = read_run(run_dir)
    if decode_from == "grid":
        rows, _ = measure_generate(recipe_path, repeats, overrides)
        decode = fit_decode(rows)
        overhead = rollout_overhead(steps, decode, r.rollout.hf_max_batch)
    elif decode_from == "run":
        rows = run_decode_rows(steps, r.rollout.hf_max_batch)
        decode, overhead = fit_decode(rows), 0.0
    else:
        raise ValueError(f"decode_from = {decode_from!r}: expected run or grid")
    costs = {**decode, **fit_train(steps)}
    costs["prefill_s"] += overhead
    grid = "\n".join(f"#   B={b} P={p} L={n}: {t:.4f} s" for b, p, n, t in rows)
    what = f"generate grid (median of {repeats})" if decode_from == "grid" else "the calibration run's rollout steps"
    Path(out).write_text(f"# credo simulate calibrate --recipe {recipe_path} --run {run_dir} --decode-from {decode_from} "
                         f"{' '.join(overrides or [])}\n# {time.strftime('%Y-%m-%d %H:%M')} decode data, {what}:\n{grid}\n"
                         f"# rollout overhead from the calibration run, added to prefill_s: {overhead:.4f} s\n"
                         + yaml.safe_dump({"costs": costs}, sort_keys=False))
    return costs
