"""Simulate a measured run and compare its step times with the measured ones.

`replay`: the run's own per-step lengths (from its rollout dumps) go through the simulator sample for sample;
what differs is only the cost model, so this checks the costs and the engine model. `distribution`: lengths are
drawn from another run's dumps (an empirical model, as a user would have before running), and the mean step time
is compared. Costs come from `credo simulate calibrate`, measured apart from the validated run.

Validating tail batching or the overlap schedule is the same command with `--mode tail_batching|async` and
`--lengths-from`: the mode's settings come from the recipe (stages.schedule_kwargs: prompt_ratio, max_responses;
max_staleness, request_prompts, partial_rollout; algo.old_log_probs) and the comparison is the mean step time, since
aborted responses are not in the dumps.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

from credo.simulate.calibrate import read_run
from credo.simulate.costs import Costs
from credo.simulate.lengths import LengthModel, dump_paths, fit_dumps
from credo.simulate.runner import simulate_mode
from credo.simulate.scenario import ModeSpec, Scenario, Workload


def _mode_spec(r, costs: Costs, mode: str) -> ModeSpec:
    """The mode as the recipe runs it on this machine: one device, colocated, the hf engine; `async` is the
    overlap schedule's worker process beside the trainer (two devices, credo.simulate.engine's overlap worker)."""
    if mode == "async":
        return _overlap_spec(r, costs)
    # a synchronous credo run takes pi_old from the sampler (no recompute at S = 0)
    spec = ModeSpec(name=mode, mode=mode, devices=1, costs=costs, old_log_probs="rollout")
    if r.rollout.backend == "hf" and mode == "sync":
        spec.engine, spec.max_batch = "static", r.rollout.hf_max_batch
    else:  # continuous batching, whole step at once (vLLM)
        spec.max_batch = r.rollout.prompts_per_step * r.rollout.group_size * 2
    tb = _tail_batching_settings(r)
    if mode == "tail_batching" and tb is not None and r.rollout.backend == "hf":
        # the hf backend's race: one batch of every request, rows leave between chunks of chunk_tokens; its long
        # rounds are one generate() call (credo.distributed.race, credo.schedules.tail_batching)
        spec.finish_quantum, spec.long_engine = tb.chunk_tokens, "static"
        race = math.ceil(tb.prompt_ratio * r.rollout.prompts_per_step) * (tb.max_responses or r.rollout.group_size + 1)
        spec.max_batch = max(spec.max_batch, race)
    if mode == "tail_batching" and tb is not None:
        spec.prompt_ratio = tb.prompt_ratio
        spec.max_responses = tb.max_responses or r.rollout.group_size + 1  # 0 = R0 + 1, as the recipe reads it
    return spec


def _overlap_spec(r, costs: Costs) -> ModeSpec:
    """`stages.schedule: overlap` on the hf backend: one worker process (1 rollout device) generating requests of
    request_prompts x group_size rows as generate calls, the trainer (1 train device), the recipe's staleness bound,
    partial rollout and old_log_probs. The two processes share the machine; the model takes them as independent
    devices (docs/simulate.md), so `costs` should be those of the thread count each process runs with."""
    from credo.schedules import schedule, schedule_of
    from credo.train.registry import Resolved, settings_of

    name, kwargs, key, _ = schedule_of(r)
    if name != "overlap":
        raise ValueError(f"--mode async models stages.schedule: overlap; the recipe's schedule is {name}")
    s = settings_of(Resolved(lambda ctx: None, schedule(name).settings), kwargs, key)
    if r.rollout.backend != "hf" or s.workers != 1:
        raise ValueError(f"--mode async models one hf overlap worker; the recipe has rollout.backend "
                         f"{r.rollout.backend} and {s.workers} workers")
    if s.stale_policy != "drop":
        raise ValueError(f"--mode async: stale_policy {s.stale_policy} is not modelled (the simulator drops)")
    rows = (s.request_prompts or r.rollout.prompts_per_step) * r.rollout.group_size
    return ModeSpec(name="async", mode="async", placement="disaggregated", rollout_devices=1, train_devices=1,
                    engine="static", max_batch=rows, staleness=s.max_staleness, partial_rollout=s.partial_rollout,
                    old_log_probs=r.algo.old_log_probs, costs=costs)


def _tail_batching_settings(r):
    """The recipe's tail-batching settings (stages.schedule: tail_batching, or the deprecated rollout.tail_batching),
    read through the schedule (credo.schedules.schedule_of, the one place either key is read); None otherwise."""
    from credo.schedules import schedule, schedule_of
    from credo.train.registry import Resolved, settings_of

    name, kwargs, key, _ = schedule_of(r)
    if name != "tail_batching":
        return None
    return settings_of(Resolved(lambda ctx: None, schedule(name).settings), kwargs, key)


def _load_costs(path: str) -> Costs:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return Costs.from_dict(raw.get("costs", raw), where=f"{path}: costs")


def validate(recipe_path: str, run_dir: str, costs_path: str, *, lengths_from: str | None = None,
             mode: str = "sync", overrides: list[str] | None = None) -> str:
    """The comparison as markdown: per step (replay, sync only) and the mean (replay and/or distribution)."""
    from credo.config import load_recipe

    r = load_recipe(recipe_path, list(overrides or []))
    costs = _load_costs(costs_path)
    steps = read_run(run_dir)
    measured = [s["metrics"] for s in steps]
    lines = [f"Run {run_dir} ({len(steps)} steps with dumps), costs {costs_path}, mode {mode}.", ""]
    spec = _mode_spec(r, costs, mode)
    rows = []
    if mode == "sync":
        lm = LengthModel(kind="replay", replay=[s["pairs"] for s in steps], max_len=r.rollout.max_new_tokens)
        wl = Workload(prompts_per_step=r.rollout.prompts_per_step, group_size=r.rollout.group_size, lengths=lm,
                      train_padding="packed" if r.algo.packing else "padded")
        res, _ = simulate_mode(Scenario("replay", len(steps), 0, mode, wl, [spec]), spec)
        lines += ["| step | max len | measured rollout (s) | sim rollout (s) | measured train+reward+sync (s) | "
                  "sim (s) | measured step (s) | sim step (s) | error |", "|" + "---|" * 9]
        for s, m, rec in zip(steps, measured, res.records):
            sim = rec.end - rec.start
            meas = m["perf/step_time_s"]
            rest_m = m["perf/reward_s"] + m["perf/train_s"] + m["perf/sync_s"]
            rows.append((s["step"], meas, sim))
            lines.append(f"| {s['step']} | {max(n for _, n in s['pairs'])} | {m['perf/rollout_s']:.3f} | "
                         f"{rec.rollout_s:.3f} | {rest_m:.3f} | {rec.reward_s + rec.train_s + rec.sync_s:.3f} | "
                         f"{meas:.3f} | {sim:.3f} | {100 * (sim - meas) / meas:+.1f}% |")
        later = [x for x in rows if x[0] != 1] or rows
        mm, ms = statistics.mean(x[1] for x in later), statistics.mean(x[2] for x in later)
        errs = [abs(x[2] - x[1]) / x[1] for x in later]
        lines += ["", f"Replay, steps {later[0][0]}-{later[-1][0]}: measured mean {mm:.3f} s, simulated {ms:.3f} s, "
                  f"error {100 * (ms - mm) / mm:+.1f}%; per-step |error| median {100 * statistics.median(errs):.1f}%, "
                  f"max {100 * max(errs):.1f}%."]
    if lengths_from:
        paths = dump_paths(lengths_from)
        if not paths:
            raise ValueError(f"--lengths-from {lengths_from}: no rollout dumps")
        lm = fit_dumps(paths, max_len=r.rollout.max_new_tokens)
        wl = Workload(prompts_per_step=r.rollout.prompts_per_step, group_size=r.rollout.group_size, lengths=lm,
                      train_padding="packed" if r.algo.packing else "padded")
        sims = [simulate_mode(Scenario("dist", 50, seed, mode, wl, [spec]), spec, seed)[0].step_time_s
                for seed in range(3)]
        later = [m["perf/step_time_s"] for s, m in zip(steps, measured) if s["step"] != 1] or \
            [m["perf/step_time_s"] for m in measured]
        mm, ms = statistics.mean(later), statistics.mean(sims)
        lines += ["", f"Distribution (lengths fitted from {lengths_from}, 3 seeds x 50 steps): measured mean "
                  f"{mm:.3f} s, simulated {ms:.3f} s (seeds {', '.join(f'{x:.3f}' for x in sims)}), "
                  f"error {100 * (ms - mm) / mm:+.1f}%."]
    return "\n".join(lines) + "\n"
