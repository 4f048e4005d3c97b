"""`credo ablate SWEEP.yaml`: run recipe variants over seeds as separate processes and tabulate them.

A sweep file names a base recipe, the variants (a list of named override sets, or a grid), the seeds and
the metrics to report::

    name: tricks_or_traps                    # names the default output_dir
    description: one paragraph for table.md  # optional
    base: recipes/quickstart.yaml            # a recipe; relative to the working directory (or to this file)
    overrides: [run.steps=40]                # applied to every run (optional)
    seeds: [0, 1, 2]                         # each run gets run.seed=<seed>
    variants:                                # name -> overrides: a list of key=value or a mapping; [] = the base
      grpo: [algo.advantage=grpo]
      lite_ppo: {algo.advantage: lite_ppo}
    # or instead of variants, the product of value lists (variants named like advantage=grpo,agg_mode=token-mean):
    # grid: {algo.advantage: [grpo, lite_ppo], algo.agg_mode: [token-mean, seq-mean-token-mean]}
    metrics:                                 # optional; each run reduced to one number, then mean ± std over seeds
      - {key: eval/accuracy, reduce: final}            # the last logged value
      - {key: eval/accuracy, reduce: best}             # max (mode: min for the smallest)
      - {key: train/reward_mean, reduce: last_k_mean, k: 5}   # mean of the last k logged values
    curves: [eval/accuracy, train/reward_mean]         # optional; default: the metric keys
    output_dir: runs/ablations/tricks_or_traps         # optional; default runs/ablations/<name>
    launcher: torchrun --standalone --nproc_per_node 8 # optional; what starts `-m credo.cli run` (default: this python)
    gpus_per_run: 8                                    # optional; GPUs per run (CUDA_VISIBLE_DEVICES), default 1

Every run is `python -m credo.cli run BASE <overrides> <variant overrides> run.seed=<s>
run.output_dir=<output_dir>/runs/<variant>/seed<s>`, its output logged to `log.txt` in its folder. Before
any run starts, every run's overrides are loaded with `credo.config.load_recipe`, so an unknown key or a
bad value stops the sweep naming the variant and the key. `--jobs N` runs (default: one per CPU core, or
one per gpus_per_run GPUs) go at once, each with run.threads and OMP_NUM_THREADS set to cores // jobs
(divided again by gpus_per_run under a launcher), so the cores are not oversubscribed.

Resuming: a run is finished when its process exited 0 and its metrics.jsonl holds the step run.steps;
the runner then writes `DONE` (with the run's config hash) into its folder. Invoking the same sweep
again skips finished runs, resumes unfinished or failed ones with run.resume=auto (from their newest
good checkpoint), and restarts from scratch an unfinished run whose config has changed. A finished run
whose config has changed stops the sweep before anything starts (its results would no longer match the
sweep file). Runs that share a warm-up (same model, task, sft and seed) wait for the first of them to
finish the warm-up, so it is trained once and then read from the cache.

Outputs in output_dir: `table.md` and `table.csv` (a row per variant: mean ± std over finished seeds and
their number n, per metric), `curves.png` (mean curve per variant, shaded ± std), `sweep.json` (each
run's overrides, config hash, status, exit code and, for a failed run, the end of its log) and a copy of
the sweep file. A failed run is reported with the last lines of its log; the table holds the others.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from credo.config import ConfigError, Recipe, RunConfig, load_recipe, recipe_to_dict, recipe_to_yaml
from credo.tracking import read_metrics

SWEEP_KEYS = ("name", "description", "base", "overrides", "seeds", "variants", "grid", "metrics", "curves", "output_dir",
              "launcher", "gpus_per_run")
METRIC_KEYS = ("key", "reduce", "k", "mode", "label")
REDUCES = ("final", "best", "last_k_mean")
RUNNER_KEYS = ("run.seed", "run.output_dir", "run.resume")  # set per run by the runner
DEFAULT_METRICS = [{"key": "eval/accuracy", "reduce": "final"}, {"key": "eval/accuracy", "reduce": "best"},
                   {"key": "train/reward_mean", "reduce": "last_k_mean", "k": 5}]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]*$")
LOG_TAIL_LINES = 15
ATTEMPT_MARK = "=== credo ablate: attempt "


@dataclass
class Metric:
    key: str
    """Metric name in metrics.jsonl, e.g. eval/accuracy."""
    reduce: str
    """How one run's curve becomes one number: final, best or last_k_mean."""
    k: int = 1
    """Number of last logged values averaged by last_k_mean."""
    mode: str = "max"
    """Whether best is the largest (max) or the smallest (min) value."""
    label: str = ""
    """Column name in the tables."""


@dataclass
class Sweep:
    path: Path
    name: str
    description: str
    base: Path
    overrides: list[str]
    seeds: list[int]
    variants: dict[str, list[str]]
    metrics: list[Metric]
    curves: list[str]
    output_dir: Path
    launcher: list[str] = field(default_factory=list)
    """Command that starts each run's python, e.g. torchrun --standalone --nproc_per_node 8 (default: this python)."""
    gpus_per_run: int = 1
    """GPUs given to each run (CUDA_VISIBLE_DEVICES) when GPUs are present."""


@dataclass
class Run:
    variant: str
    seed: int
    run_dir: Path
    overrides: list[str]
    """Everything passed after the base recipe, in order."""
    recipe: Recipe
    config_hash: str
    warmup_group: str | None
    """Runs with the same group share one cached SFT warm-up (None: no warm-up)."""
    action: str = "new"
    """new, resume, restart (config changed, unfinished), done or stale (config changed, finished)."""
    status: str = "pending"
    exit_code: int | None = None
    wall_s: float | None = None
    error_tail: str = ""
    stale_diff: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ sweep file


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"sweep '{path}': {msg}")


def _override_str(key: str, value) -> str:
    """`key=value` with the value written so that the recipe loader's YAML parse gives it back."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value)
    elif isinstance(value, str):
        text = value if value and yaml.safe_load(value) == value else json.dumps(value)
    else:
        text = str(value)
    return f"{key}={text}"


def _override_list(path: Path, where: str, value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [_override_str(str(k), v) for k, v in value.items()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        for v in value:
            if "=" not in v or not v.split("=", 1)[0].strip():
                raise _fail(path, f"{where}: '{v}' is not of the form key=value")
        return list(value)
    raise _fail(path, f"{where} is a {type(value).__name__}, expected a list of key=value strings or a mapping")


def _name_part(value) -> str:
    """A grid value as part of a folder name: {clip_low: 0.2} -> clip_low_0.2, {} -> none."""
    if isinstance(value, dict):
        return "_".join(f"{k}_{_name_part(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return "_".join(_name_part(v) for v in value) or "none"
    return _override_str("k", value).split("=", 1)[1].strip('"')


def _grid_variants(path: Path, grid) -> dict[str, list[str]]:
    if not isinstance(grid, dict) or not grid:
        raise _fail(path, "grid must be a non-empty mapping of key -> list of values")
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise _fail(path, f"grid.{k} must be a non-empty list of values, got {vals!r}")
    keys = list(grid)
    short = [k.split(".")[-1] for k in keys]
    if len(set(short)) < len(short):
        short = keys
    out: dict[str, list[str]] = {}
    for combo in itertools.product(*(grid[k] for k in keys)):
        overrides = [_override_str(k, v) for k, v in zip(keys, combo)]
        name = ",".join(f"{s}={_name_part(v)}" for s, v in zip(short, combo))
        name = re.sub(r"[^A-Za-z0-9._=,+-]", "", name.replace(" ", ""))
        if name in out:
            raise _fail(path, f"grid gives two variants named '{name}'; use a variants list with explicit names")
        out[name] = overrides
    return out


def _metric(path: Path, i: int, spec) -> Metric:
    where = f"metrics[{i}]"
    if not isinstance(spec, dict):
        raise _fail(path, f"{where} is a {type(spec).__name__}, expected a mapping like {{key: eval/accuracy, reduce: final}}")
    unknown = [k for k in spec if k not in METRIC_KEYS]
    if unknown:
        raise _fail(path, f"unknown key '{where}.{unknown[0]}' (valid keys: {', '.join(METRIC_KEYS)})")
    if not isinstance(spec.get("key"), str) or not spec["key"]:
        raise _fail(path, f"{where}.key is required: a metrics.jsonl name such as eval/accuracy")
    reduce = spec.get("reduce", "final")
    if reduce not in REDUCES:
        raise _fail(path, f"{where}.reduce = {reduce!r}, expected one of {', '.join(REDUCES)}")
    k = spec.get("k", 1)
    if "k" in spec and reduce != "last_k_mean":
        raise _fail(path, f"{where}.k is only used by reduce: last_k_mean")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _fail(path, f"{where}.k = {k!r}, expected an integer >= 1")
    mode = spec.get("mode", "max")
    if mode not in ("max", "min"):
        raise _fail(path, f"{where}.mode = {mode!r}, expected max or min")
    if "mode" in spec and reduce != "best":
        raise _fail(path, f"{where}.mode is only used by reduce: best")
    label = spec.get("label") or {"final": f"{spec['key']} final", "best": f"{spec['key']} {'best' if mode == 'max' else 'min'}",
                                  "last_k_mean": f"{spec['key']} last-{k} mean"}[reduce]
    return Metric(key=spec["key"], reduce=reduce, k=k, mode=mode, label=str(label))


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file strictly (unknown keys and wrong types name the key at fault).

    Raises:
        ConfigError: a missing file, an unknown key, a wrong type, or a variant that sets a runner key.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file not found: '{path}' (expected a YAML file, e.g. recipes/ablations/tricks_or_traps.yaml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise _fail(path, f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise _fail(path, f"must be a mapping at the top level, got {type(data).__name__}")
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        hint = (" (this looks like a recipe: run it with `credo run`, or name it as the sweep's base)"
                if {"run", "algo", "model"} & set(data) else "")
        raise _fail(path, f"unknown sweep key '{unknown[0]}' (valid keys: {', '.join(SWEEP_KEYS)}){hint}")
    name = data.get("name") or path.stem
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _fail(path, f"name = {name!r}, expected letters, digits and ._=,+- (it names a folder)")
    if not isinstance(data.get("base"), str):
        raise _fail(path, "base is required: the path of the recipe every run starts from")
    base = Path(data["base"])
    if not base.is_file() and not base.is_absolute() and (path.parent / base).is_file():
        base = path.parent / base
    if not base.is_file():
        raise _fail(path, f"base recipe not found: '{data['base']}' (relative to the working directory or the sweep file)")
    seeds = data.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise _fail(path, f"seeds = {seeds!r}, expected a non-empty list of distinct integers")
    if ("variants" in data) == ("grid" in data):
        raise _fail(path, "give exactly one of variants (name -> overrides) or grid (key -> list of values)")
    if "grid" in data:
        variants = _grid_variants(path, data["grid"])
    else:
        if not isinstance(data["variants"], dict) or not data["variants"]:
            raise _fail(path, "variants must be a non-empty mapping of name -> overrides")
        variants = {}
        for vname, ov in data["variants"].items():
            if not isinstance(vname, str) or not NAME_RE.match(vname):
                raise _fail(path, f"variant name {vname!r}: expected letters, digits and ._=,+- (it names a folder)")
            variants[vname] = _override_list(path, f"variants.{vname}", ov)
    overrides = _override_list(path, "overrides", data.get("overrides"))
    for where, ovs in [("overrides", overrides)] + [(f"variants.{v}", o) for v, o in variants.items()]:
        for ov in ovs:
            if ov.split("=", 1)[0].strip() in RUNNER_KEYS:
                raise _fail(path, f"{where}: '{ov}' sets {ov.split('=', 1)[0].strip()}, which credo ablate sets per run "
                                  "(seeds: lists the seeds; output_dir: names the sweep folder)")
    metrics_spec = data.get("metrics", DEFAULT_METRICS)
    if not isinstance(metrics_spec, list) or not metrics_spec:
        raise _fail(path, "metrics must be a non-empty list of {key, reduce[, k, mode, label]}")
    metrics = [_metric(path, i, m) for i, m in enumerate(metrics_spec)]
    if len({m.label for m in metrics}) != len(metrics):
        raise _fail(path, "two metrics share a label; give one of them a label")
    curves = data.get("curves", list(dict.fromkeys(m.key for m in metrics)))
    if not isinstance(curves, list) or not all(isinstance(c, str) for c in curves):
        raise _fail(path, f"curves = {curves!r}, expected a list of metric names")
    out = data.get("output_dir", os.path.join("runs", "ablations", name))
    if not isinstance(out, str) or not out:
        raise _fail(path, f"output_dir = {out!r}, expected a folder path")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description must be a string")
    launcher = data.get("launcher") or ""
    if not isinstance(launcher, str):
        raise _fail(path, f"launcher = {launcher!r}, expected a command string such as 'torchrun --standalone --nproc_per_node 8'")
    gpus_per_run = data.get("gpus_per_run", 1)
    if not isinstance(gpus_per_run, int) or isinstance(gpus_per_run, bool) or gpus_per_run < 1:
        raise _fail(path, f"gpus_per_run = {gpus_per_run!r}, expected an integer >= 1")
    return Sweep(path=path, name=name, description=description.strip(), base=base, overrides=overrides, seeds=list(seeds),
                 variants=variants, metrics=metrics, curves=curves, output_dir=Path(out), launcher=shlex.split(launcher),
                 gpus_per_run=gpus_per_run)


# ---------------------------------------------------------------------------------------------- runs


RESULT_NEUTRAL = ("output_dir", "threads", "progress", "plot", "resume")
"""`run.*` settings that do not change a run's results (where it writes, threads, display, resuming)."""


def config_hash(r: Recipe) -> str:
    """Hash of the resolved recipe without the settings in RESULT_NEUTRAL (reset to their defaults)."""
    defaults = RunConfig()
    run = dataclasses.replace(r.run, **{k: getattr(defaults, k) for k in RESULT_NEUTRAL})
    return hashlib.sha256(recipe_to_yaml(dataclasses.replace(r, run=run)).encode()).hexdigest()[:16]


def _warmup_group(r: Recipe) -> str | None:
    """The SFT warm-up a run needs, as the trainer's cache key (runs that share it share one warm-up)."""
    if not (r.sft.enabled and r.sft.steps > 0):
        return None
    from credo.sft import sft_cache_key

    return sft_cache_key(r, r.model.path)


def plan_runs(sweep: Sweep, *, threads: int) -> list[Run]:
    """Every (variant, seed) run with its overrides, validated by loading its recipe; nothing is started.

    Raises:
        ConfigError: a run's overrides do not load, naming the variant, the seed and the key.
    """
    runs = []
    defaults = ["run.progress=false", "run.plot=false", f"run.threads={threads}"]
    for variant, vo in sweep.variants.items():
        for seed in sweep.seeds:
            run_dir = sweep.output_dir / "runs" / variant / f"seed{seed}"
            overrides = defaults + sweep.overrides + vo + [f"run.seed={seed}", f"run.output_dir={run_dir}"]
            try:
                recipe = load_recipe(sweep.base, overrides)
            except ConfigError as e:
                raise _fail(sweep.path, f"variant '{variant}' (seed {seed}): {e}") from None
            runs.append(Run(variant=variant, seed=seed, run_dir=run_dir, overrides=overrides, recipe=recipe,
                            config_hash=config_hash(recipe), warmup_group=_warmup_group(recipe)))
    return runs


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_diff(run: Run) -> list[str]:
    """`key: old -> new` between the config a finished run was started with and the sweep's current one."""
    old = _flatten(_read_json(run.run_dir / "sweep_run.json").get("config") or {})
    if not old:
        return []
    new = _flatten(recipe_to_dict(run.recipe))
    ignore = {f"run.{k}" for k in RESULT_NEUTRAL}
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if k not in ignore and old.get(k) != new.get(k)]


def classify(run: Run) -> str:
    """What this invocation does with the run: new, resume, restart, done or stale."""
    done = _read_json(run.run_dir / "DONE") if (run.run_dir / "DONE").exists() else None
    if done is not None:
        if done.get("config_hash") == run.config_hash:
            return "done"
        run.stale_diff = _config_diff(run)
        return "stale"
    if not run.run_dir.exists():
        return "new"
    started = _read_json(run.run_dir / "sweep_run.json")
    return "resume" if started.get("config_hash") == run.config_hash else "restart"


def finished_ok(run: Run) -> bool:
    """The run's metrics.jsonl holds its last step."""
    return any(row.get("step") == run.recipe.run.steps for row in read_metrics(run.run_dir / "metrics.jsonl"))


def _log_tail(log_path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    text = text.rsplit(ATTEMPT_MARK, 1)[-1].split("\n", 1)[-1] if ATTEMPT_MARK in text else text
    lines = [l for l in text.splitlines() if l.strip()]
    return "\n".join(lines[-n:]) or "(empty log)"


# ------------------------------------------------------------------------------------- aggregation


def reduce_metric(rows: list[dict], metric: Metric) -> float | None:
    """One run's curve of metric.key to one number (None when the run never logged it)."""
    vals = [float(r[metric.key]) for r in sorted(rows, key=lambda r: r.get("step", 0))
            if isinstance(r.get(metric.key), (int, float)) and math.isfinite(r[metric.key])]
    if not vals:
        return None
    if metric.reduce == "final":
        return vals[-1]
    if metric.reduce == "best":
        return max(vals) if metric.mode == "max" else min(vals)
    tail = vals[-metric.k:]
    return sum(tail) / len(tail)


def summarize(sweep: Sweep, runs: list[Run]) -> list[dict]:
    """A row per variant: n finished seeds and, per metric label, (mean, std, n) over them."""
    out = []
    for variant in sweep.variants:
        done = [r for r in runs if r.variant == variant and r.status == "done"]
        rows = {r.seed: read_metrics(r.run_dir / "metrics.jsonl") for r in done}
        cells = {}
        for m in sweep.metrics:
            vals = [v for v in (reduce_metric(rows[r.seed], m) for r in done) if v is not None]
            mean = statistics.fmean(vals) if vals else None
            std = statistics.stdev(vals) if len(vals) > 1 else None
            cells[m.label] = (mean, std, len(vals))
        out.append({"variant": variant, "n": len(done), "seeds": [r.seed for r in done], "metrics": cells})
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x == 0 or 0.01 <= abs(x) < 1000 else f"{x:.3g}"


def write_tables(sweep: Sweep, summary: list[dict]) -> None:
    labels = [m.label for m in sweep.metrics]
    header = "| variant | n | " + " | ".join(labels) + " |"
    lines = [f"# {sweep.name}", ""]
    if sweep.description:
        lines += [sweep.description, ""]
    lines += [f"Base recipe `{sweep.base}`, seeds {sweep.seeds}; sweep file `{sweep.path}`.", "",
              header, "|" + "---|" * (len(labels) + 2)]
    for row in summary:
        cells = []
        for lab in labels:
            mean, std, n = row["metrics"][lab]
            cell = _fmt(mean) if std is None else f"{_fmt(mean)} ± {_fmt(std)}"
            cells.append(cell + (f" (n={n})" if n != row["n"] else ""))
        lines.append(f"| {row['variant']} | {row['n']} | " + " | ".join(cells) + " |")
    lines += ["", "Mean ± sample standard deviation over seeds; n = finished seeds.", "", "Variants:", ""]
    for v in sweep.variants:
        lines.append(f"- `{v}`: " + (" ".join(f"`{o}`" for o in sweep.variants[v]) or "the base recipe"))
    if sweep.overrides:
        lines += ["", "Every run: " + " ".join(f"`{o}`" for o in sweep.overrides)]
    _atomic_write(sweep.output_dir / "table.md", "\n".join(lines) + "\n")
    tmp = sweep.output_dir / "table.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "n"] + [f"{lab} {part}" for lab in labels for part in ("mean", "std", "n")])
        for row in summary:
            w.writerow([row["variant"], row["n"]] + [("" if x is None else x) for lab in labels for x in row["metrics"][lab]])
    os.replace(tmp, sweep.output_dir / "table.csv")


def plot_sweep_curves(sweep: Sweep, runs: list[Run]) -> None:
    """Mean curve per variant over its finished seeds with a ± std band, one panel per curve key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sweep.curves or [m.key for m in sweep.metrics]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), constrained_layout=True, squeeze=False)
    metrics = {id(r): read_metrics(r.run_dir / "metrics.jsonl") for r in runs if r.status == "done"}
    for ax, key in zip(axes[0], keys):
        for i, variant in enumerate(sweep.variants):
            per_step: dict[int, list[float]] = {}
            for r in runs:
                for row in metrics.get(id(r), []) if r.variant == variant else []:
                    v = row.get(key)
                    if isinstance(v, (int, float)) and math.isfinite(v):
                        per_step.setdefault(int(row["step"]), []).append(float(v))
            if not per_step:
                continue
            steps = sorted(per_step)
            mean = [statistics.fmean(per_step[s]) for s in steps]
            std = [statistics.stdev(per_step[s]) if len(per_step[s]) > 1 else 0.0 for s in steps]
            color = f"C{i % 10}"
            ax.plot(steps, mean, color=color, label=variant, marker="o" if len(steps) <= 12 else None, ms=3)
            ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color,
                            alpha=0.15, linewidth=0)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{sweep.name}: mean ± std over seeds", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    tmp = sweep.output_dir / "curves.tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, sweep.output_dir / "curves.png")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_sweep_json(sweep: Sweep, runs: list[Run], *, jobs: int, threads: int) -> None:
    data = {
        "name": sweep.name, "sweep_file": str(sweep.path), "base": str(sweep.base), "seeds": sweep.seeds,
        "variants": sweep.variants, "overrides": sweep.overrides, "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "jobs": jobs, "threads_per_run": threads,
        "runs": [{"variant": r.variant, "seed": r.seed, "run_dir": str(r.run_dir.relative_to(sweep.output_dir)),
                  "config_hash": r.config_hash, "status": r.status, "exit_code": r.exit_code, "wall_s": r.wall_s,
                  "overrides": r.overrides, **({"error_tail": r.error_tail} if r.error_tail else {})} for r in runs],
    }
    _atomic_write(sweep.output_dir / "sweep.json", json.dumps(data, indent=1) + "\n")


# ------------------------------------------------------------------------------------------ running


def _train_argv(base: Path, overrides: list[str], launcher: list[str]) -> list[str]:
    """The command line of one run (tests substitute a fake trainer here)."""
    return [*(launcher or [sys.executable]), "-m", "credo.cli", "run", str(base), *overrides]


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no usable CUDA means CPU runs
        return []


@dataclass
class _Job:
    run: Run
    proc: subprocess.Popen
    slot: int
    started: float
    log: object


class _Interrupted(Exception):
    pass


def _child_env(threads: int, gpu: str | None) -> dict:
    # each run is a world of one that picks its own rendezvous port
    from credo.distributed.engine import DIST_ENV_VARS

    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _invocation_overrides(run: Run) -> list[str]:
    return run.overrides + (["run.resume=auto"] if run.action == "resume" else [])


def _start(run: Run, slot: int, sweep: Sweep, lock_fd: int, gpus: list[str]) -> _Job:
    if run.action == "restart":
        shutil.rmtree(run.run_dir, ignore_errors=True)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    argv = _train_argv(sweep.base, _invocation_overrides(run), sweep.launcher)
    _atomic_write(run.run_dir / "sweep_run.json", json.dumps(
        {"variant": run.variant, "seed": run.seed, "config_hash": run.config_hash, "argv": argv,
         "config": recipe_to_dict(run.recipe)}, indent=1) + "\n")
    log = open(run.run_dir / "log.txt", "a")
    log.write(f"{ATTEMPT_MARK}{time.strftime('%Y-%m-%d %H:%M:%S')} ({run.action}): {' '.join(argv)}\n")
    log.flush()
    g = sweep.gpus_per_run
    gpu = ",".join(gpus[(slot * g + i) % len(gpus)] for i in range(g)) if gpus else None
    # own session: Ctrl-C reaches the runner, which stops runs in order; the inherited lock marks the folder
    # busy for as long as any run lives, even if the runner itself is killed
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_child_env(run.recipe.run.threads, gpu), start_new_session=True, pass_fds=(lock_fd,))
    run.status = "running"
    return _Job(run=run, proc=proc, slot=slot, started=time.time(), log=log)


def _finish(job: _Job, rc: int) -> None:
    run = job.run
    job.log.close()
    run.exit_code, run.wall_s = rc, round(time.time() - job.started, 1)
    if rc == 0 and finished_ok(run):
        run.status, run.error_tail = "done", ""
        _atomic_write(run.run_dir / "DONE", json.dumps({"config_hash": run.config_hash, "wall_s": run.wall_s,
                                                        "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    else:
        run.status = "failed"
        why = "" if rc != 0 else f"exited 0 but metrics.jsonl has no step {run.recipe.run.steps}\n"
        run.error_tail = why + _log_tail(run.run_dir / "log.txt")


def _stop(jobs: list[_Job], grace_s: float = 10.0) -> None:
    for job in jobs:
        try:
            os.killpg(job.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    for job in jobs:
        try:
            job.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.proc.wait()
        job.log.close()
        job.run.status, job.run.exit_code = "interrupted", job.proc.returncode


def _schedule(runs: list[Run], sweep: Sweep, *, jobs: int, lock_fd: int, gpus: list[str], poll_s: float) -> None:
    from tqdm import tqdm

    pending = [r for r in runs if r.action in ("new", "resume", "restart")]
    warm = {r.warmup_group for r in runs if r.action == "done"}
    running: list[_Job] = []
    bar = tqdm(total=len(runs), initial=len(runs) - len(pending), desc=f"ablate {sweep.name}", unit="run",
               dynamic_ncols=True)
    failed = 0
    try:
        while pending or running:
            for job in list(running):
                rc = job.proc.poll()
                if rc is None:
                    m = job.run.run_dir / "metrics.jsonl"  # written after the warm-up and the step-0 eval
                    if job.run.warmup_group not in warm and m.exists() and m.stat().st_mtime >= job.started:
                        warm.add(job.run.warmup_group)
                    continue
                running.remove(job)
                _finish(job, rc)
                bar.update(1)
                if job.run.status == "done":
                    warm.add(job.run.warmup_group)
                    bar.write(f"done   {job.run.variant}/seed{job.run.seed} ({job.run.wall_s:.0f} s)")
                else:
                    failed += 1
                    bar.write(f"FAILED {job.run.variant}/seed{job.run.seed} (exit {rc}); log: {job.run.run_dir / 'log.txt'}")
                write_sweep_json(sweep, runs, jobs=jobs, threads=runs[0].recipe.run.threads)
            while len(running) < jobs:
                busy = {j.run.warmup_group for j in running}
                # a warm-up is trained by one run; the others of its group wait for the cache
                nxt = next((r for r in pending if r.warmup_group is None or r.warmup_group in warm
                            or r.warmup_group not in busy), None)
                if nxt is None:
                    break
                pending.remove(nxt)
                slot = min(set(range(jobs)) - {j.slot for j in running})
                running.append(_start(nxt, slot, sweep, lock_fd, gpus))
            bar.set_postfix(running=len(running), failed=failed, refresh=False)
            bar.refresh()
            time.sleep(poll_s)
    except (KeyboardInterrupt, _Interrupted):
        bar.write(f"interrupted: stopping {len(running)} run(s); invoke the sweep again to finish it")
        _stop(running)
        raise
    finally:
        bar.close()


def _print_plan(runs: list[Run], sweep: Sweep, *, jobs: int, threads: int) -> None:
    todo = [r for r in runs if r.action != "done"]
    print(f"sweep {sweep.name}: {len(sweep.variants)} variants x {len(sweep.seeds)} seeds = {len(runs)} runs, "
          f"{len(runs) - len(todo)} finished, {len(todo)} to run ({jobs} at once, {threads} thread(s) each); "
          f"output {sweep.output_dir}")
    for r in runs:
        print(f"  [{r.action:7s}] {r.variant}/seed{r.seed}  " + " ".join(sweep.variants[r.variant]))
    if todo:
        print("first command: " + " ".join(_train_argv(sweep.base, _invocation_overrides(todo[0]), sweep.launcher)))


def run_sweep(path: str | Path, *, jobs: int = 0, dry_run: bool = False, poll_s: float = 0.5) -> int:
    """Run (or, with dry_run, list) a sweep's runs, then write its table, curves and sweep.json.

    Args:
        path: the sweep YAML file (format in this module's docstring).
        jobs: runs at once; 0 means one per GPU, or one per CPU core.
        dry_run: list the runs and what would happen to each; start nothing, write nothing.
        poll_s: seconds between checks on the running processes.

    Returns:
        Exit code: 0 when every run finished, 1 when some failed (or the folder is busy), 130 when interrupted.

    Raises:
        ConfigError: the sweep file or any run's overrides are invalid, or a finished run's config changed.
    """
    sweep = load_sweep(path)
    n_runs = len(sweep.variants) * len(sweep.seeds)
    gpus = _gpu_ids()
    cores = _cpu_count()
    jobs = jobs if jobs > 0 else (len(gpus) // sweep.gpus_per_run if gpus else cores)
    jobs = max(1, min(jobs, n_runs))
    procs = sweep.gpus_per_run if sweep.launcher else 1  # a launcher starts a process per GPU
    threads = max(1, cores // (jobs * procs))
    runs = plan_runs(sweep, threads=threads)
    for r in runs:
        r.action = classify(r)
        if r.action == "done":
            r.status = "done"
            r.wall_s = _read_json(r.run_dir / "DONE").get("wall_s")
    stale = [r for r in runs if r.action == "stale"]
    if stale:
        lines = [f"  {r.run_dir}: " + ("; ".join(r.stale_diff[:4]) or "config hash differs") for r in stale]
        raise _fail(sweep.path, f"{len(stale)} finished run(s) were made with a different config than the sweep file now "
                                "gives:\n" + "\n".join(lines) + f"\nexpected the same config; delete those run folders to "
                                "rerun them, or set a new output_dir")
    if dry_run:
        _print_plan(runs, sweep, jobs=jobs, threads=threads)
        return 0
    if jobs > cores:
        print(f"credo ablate: warning: {jobs} jobs on {cores} cores; each run gets 1 thread and the cores are oversubscribed",
              file=sys.stderr)
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    lock = open(sweep.output_dir / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        print(f"credo: error: sweep folder {sweep.output_dir} is in use by another `credo ablate` (or by runs it started "
              "that are still going); wait for them or stop them, then invoke again", file=sys.stderr)
        return 1
    if sweep.path.resolve() != (sweep.output_dir / "sweep.yaml").resolve():
        shutil.copyfile(sweep.path, sweep.output_dir / "sweep.yaml")
    _print_plan(runs, sweep, jobs=jobs, threads=threads)
    write_sweep_json(sweep, runs, jobs=jobs, threads=threads)

    def on_term(signum, frame):
        raise _Interrupted()

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: no handler, Ctrl-C still works
        previous = None
    code = 0
    try:
        _schedule(runs, sweep, jobs=jobs, lock_fd=lock.fileno(), gpus=gpus, poll_s=poll_s)
    except (KeyboardInterrupt, _Interrupted):
        code = 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        write_sweep_json(sweep, runs, jobs=jobs, threads=threads)
        summary = summarize(sweep, runs)
        write_tables(sweep, summary)
        if any(r.status == "done" for r in runs):
            plot_sweep_curves(sweep, runs)
        lock.close()
    failed = [r for r in runs if r.status == "failed"]
    for r in failed:
        print(f"\nrun {r.variant}/seed{r.seed} failed (exit {r.exit_code}); last lines of {r.run_dir / 'log.txt'}:\n"
              + "\n".join("  | " + l for l in r.error_tail.splitlines()), file=sys.stderr)
    print("\n" + (sweep.output_dir / "table.md").read_text())
    n_done = sum(r.status == "done" for r in runs)
    print(f"credo ablate: {n_done}/{len(runs)} runs finished, {len(failed)} failed; table in {sweep.output_dir / 'table.md'}")
    return code or (1 if failed else 0)
