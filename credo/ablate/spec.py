"""The sweep file of `credo ablate`: reading it strictly into a `Sweep`.

A sweep file names a base recipe, the variants (a list of named override sets, or a grid), the seeds,
the metrics to report and, optionally, the baseline variant the others are compared with::

    name: tricks_or_traps                    # names the default output_dir
    description: one paragraph for table.md  # optional
    base: recipes/quickstart.yaml            # a recipe; relative to the working directory (or to this file)
    overrides: [run.steps=40]                # applied to every run (optional)
    seeds: [0, 1, 2, 3, 4]                   # each run gets run.seed=<seed>; default: the five seeds 0..4
    variants:                                # name -> overrides: a list of key=value or a mapping; [] = the base
      grpo: [algo.advantage=grpo]
      lite_ppo: {algo.advantage: lite_ppo}
    # or instead of variants, the product of value lists (variants named like advantage=grpo,agg_mode=token-mean):
    # grid: {algo.advantage: [grpo, lite_ppo], algo.agg_mode: [token-mean, seq-mean-token-mean]}
    baseline: grpo                           # optional; a variant name: the table adds each variant's difference
                                             # from it (Welch's t-test, 95% CI, p-value)
    metrics:                                 # optional; each run reduced to one number, then statistics over seeds
      - {key: eval/accuracy, reduce: final}            # the last logged value
      - {key: eval/accuracy, reduce: best}             # max (mode: min for the smallest)
      - {key: train/reward_mean, reduce: last_k_mean, k: 5}   # mean of the last k logged values
      - {key: eval/accuracy, reduce: gain}             # the last logged value minus the first (gain over the start)
      - {key: eval/accuracy, reduce: first}            # the first logged value (the step-0 eval: the warm-up's level)
      - {key: eval/accuracy, reduce: auc}              # area under the curve / its step span (the curve's mean level)
      - {key: eval/accuracy, reduce: slope}            # least-squares slope over the last fifth, per 100 steps
    curves: [eval/accuracy, train/reward_mean]         # optional; default: the metric keys
    output_dir: runs/ablations/tricks_or_traps         # optional; default runs/ablations/<name>
    launcher: torchrun --standalone --nproc_per_node 8 # optional; what starts `-m credo.cli run` (default: this python)
    gpus_per_run: 8                                    # optional; GPUs per run (CUDA_VISIBLE_DEVICES), default 1
    results: docs/results/tricks_or_traps.jsonl        # optional; the raw results, one JSON line per finished run
                                                       # (credo.ablate.results); default <output_dir>/results.jsonl
    warmup_seed: run                                   # optional; the SFT warm-up's seed: run (default: each run's
                                                       # seed, so the intervals include warm-up variance), an integer
                                                       # (one warm-up pinned for every seed: a paired design whose
                                                       # intervals leave warm-up variance out), or recipe (sft.seed
                                                       # as the recipe and the variants set it)
    comparisons: ["grpo > lite_ppo", "grpo vs dapo"]   # optional; named in advance: a > b expects a above b on the
                                                       # first metric, a vs b names no direction; Holm-adjusted as a family

`credo ablate` runs a sweep file only once it is committed in git (or with --exploratory), so the comparisons it
names are on record before the runs (credo.ablate.prereg).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from credo.config import ConfigError

SWEEP_KEYS = ("name", "description", "base", "overrides", "seeds", "variants", "grid", "baseline", "metrics", "curves",
              "output_dir", "launcher", "gpus_per_run", "results", "warmup_seed", "comparisons")
METRIC_KEYS = ("key", "reduce", "k", "mode", "label")
REDUCES = ("final", "best", "last_k_mean", "gain", "auc", "slope", "first")
RUNNER_KEYS = ("run.seed", "run.output_dir", "run.resume")  # set per run by the runner
WARMUP_SEED_KEY = "sft.seed"  # set per run by the runner unless warmup_seed is 'recipe'
COMPARISON_RE = re.compile(r"^\s*(\S+)\s+(>|<|vs)\s+(\S+)\s*$")
DEFAULT_SEEDS = [0, 1, 2, 3, 4]
"""Five seeds: a 95% t-interval's half-width is t(0.975, 4)·s/√5 = 1.24·s, against 2.48·s with three."""
DEFAULT_METRICS = [{"key": "eval/accuracy", "reduce": "final"}, {"key": "eval/accuracy", "reduce": "best"},
                   {"key": "train/reward_mean", "reduce": "last_k_mean", "k": 5}]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]*$")


@dataclass
class Metric:
    key: str
    """Metric name in metrics.jsonl, e.g. eval/accuracy."""
    reduce: str
    """How one run's curve becomes one number: final, best, last_k_mean, gain (last minus first), auc, slope or first."""
    k: int = 1
    """Number of last logged values averaged by last_k_mean."""
    mode: str = "max"
    """Whether best is the largest (max) or the smallest (min) value."""
    label: str = ""
    """Column name in the tables."""


@dataclass(frozen=True)
class Comparison:
    """Two variants compared on the first metric, named in the sweep file before it runs."""

    a: str
    b: str
    expect: str
    """'>' (a expected above b), '<' (below) or 'vs' (no direction named)."""

    def __str__(self) -> str:
        return f"{self.a} {self.expect} {self.b}"


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
    baseline: str | None = None
    """The variant every other variant's difference of means is measured from (None: no difference columns)."""
    results: Path | None = None
    """The raw results file, one JSON line per finished run (default: <output_dir>/results.jsonl)."""
    warmup_seed: int | str = "run"
    """The SFT warm-up's seed: 'run' (each run's seed), an integer (pinned for all runs) or 'recipe' (left as set)."""
    comparisons: list[Comparison] = field(default_factory=list)
    """Comparisons named in advance, on the first metric; Holm-adjusted together."""
    registration: dict = field(default_factory=dict)
    """What `credo ablate` found of the sweep file in git (credo.ablate.prereg.registration): sweep_file,
    sweep_commit, exploratory; empty until a run is planned."""


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"sweep '{path}': {msg}")


def _override_str(key: str, value) -> str:
    """`key=value` with the value written so that the recipe loader's YAML parse gives it back.

    The recipe loader reads override values with yaml.safe_load, whose quoting rules differ from OmegaConf's
    dotlist grammar, so the value is written (and checked) for YAML.
    """
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
    label = spec.get("label") or default_label(spec["key"], reduce, k, mode)
    return Metric(key=spec["key"], reduce=reduce, k=k, mode=mode, label=str(label))


def default_label(key: str, reduce: str, k: int = 1, mode: str = "max") -> str:
    """A metric's column name when the sweep gives none, e.g. 'eval/accuracy final'."""
    return {"final": f"{key} final", "best": f"{key} {'best' if mode == 'max' else 'min'}",
            "last_k_mean": f"{key} last-{k} mean", "gain": f"{key} gain", "auc": f"{key} mean over the run (AUC)",
            "slope": f"{key} slope, last fifth (per 100 steps)", "first": f"{key} first"}[reduce]


def parse_comparison(text, variants, where: str) -> Comparison:
    """'a > b', 'a < b' or 'a vs b' between two variant names; ValueError naming `where` otherwise."""
    m = COMPARISON_RE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{where} = {text!r}, expected 'A > B', 'A < B' or 'A vs B' with two variant names")
    a, expect, b = m.groups()
    for v in (a, b):
        if v not in variants:
            raise ValueError(f"{where}: '{v}' names no variant (known variants: {', '.join(variants)})")
    if a == b:
        raise ValueError(f"{where}: compares '{a}' with itself")
    return Comparison(a=a, b=b, expect=expect)


def _design_keys(path: Path, data: dict, variants: dict[str, list[str]]) -> tuple:
    """results, warmup_seed and comparisons, checked."""
    results = data.get("results")
    if results is not None and (not isinstance(results, str) or not results.endswith(".jsonl")):
        raise _fail(path, f"results = {results!r}, expected a file path ending in .jsonl")
    warmup_seed = data.get("warmup_seed", "run")
    if warmup_seed not in ("run", "recipe") and (not isinstance(warmup_seed, int) or isinstance(warmup_seed, bool)):
        raise _fail(path, f"warmup_seed = {warmup_seed!r}, expected run (each run's seed), an integer (one pinned "
                          "warm-up) or recipe (sft.seed as the recipe sets it)")
    spec = data.get("comparisons", [])
    if not isinstance(spec, list):
        raise _fail(path, f"comparisons is a {type(spec).__name__}, expected a list such as ['grpo > reinforce']")
    try:
        comparisons = [parse_comparison(c, variants, f"comparisons[{i}]") for i, c in enumerate(spec)]
    except ValueError as e:
        raise _fail(path, str(e)) from None
    return (Path(results) if results else None), warmup_seed, comparisons


def _variants(path: Path, data: dict) -> dict[str, list[str]]:
    if ("variants" in data) == ("grid" in data):
        raise _fail(path, "give exactly one of variants (name -> overrides) or grid (key -> list of values)")
    if "grid" in data:
        return _grid_variants(path, data["grid"])
    if not isinstance(data["variants"], dict) or not data["variants"]:
        raise _fail(path, "variants must be a non-empty mapping of name -> overrides")
    variants = {}
    for vname, ov in data["variants"].items():
        if not isinstance(vname, str) or not NAME_RE.match(vname):
            raise _fail(path, f"variant name {vname!r}: expected letters, digits and ._=,+- (it names a folder)")
        variants[vname] = _override_list(path, f"variants.{vname}", ov)
    return variants


def _baseline(path: Path, data: dict, variants: dict[str, list[str]]) -> str | None:
    baseline = data.get("baseline")
    if baseline is None:
        return None
    if not isinstance(baseline, str) or baseline not in variants:
        raise _fail(path, f"baseline = {baseline!r} does not name a variant of this sweep (known variants: "
                          f"{', '.join(variants)})")
    return baseline


def _check_runner_keys(path: Path, overrides: list[str], variants: dict[str, list[str]], warmup_seed) -> None:
    """No override may set what the runner sets per run (the seed, the folder, and the warm-up seed unless
    warmup_seed is 'recipe')."""
    for where, ovs in [("overrides", overrides)] + [(f"variants.{v}", o) for v, o in variants.items()]:
        for ov in ovs:
            key = ov.split("=", 1)[0].strip()
            if key in RUNNER_KEYS:
                raise _fail(path, f"{where}: '{ov}' sets {key}, which credo ablate sets per run "
                                  "(seeds: lists the seeds; output_dir: names the sweep folder)")
            if key == WARMUP_SEED_KEY and warmup_seed != "recipe":
                raise _fail(path, f"{where}: '{ov}' sets {key}, which the sweep's warmup_seed sets (now "
                                  f"{warmup_seed!r}); give warmup_seed: <n> to pin one warm-up, or warmup_seed: recipe "
                                  "to let the recipe and the variants set sft.seed")


def _metrics(path: Path, data: dict) -> list:
    """The sweep's `metrics:` list (default DEFAULT_METRICS), each checked, with distinct labels."""
    metrics_spec = data.get("metrics", DEFAULT_METRICS)
    if not isinstance(metrics_spec, list) or not metrics_spec:
        raise _fail(path, "metrics must be a non-empty list of {key, reduce[, k, mode, label]}")
    metrics = [_metric(path, i, m) for i, m in enumerate(metrics_spec)]
    if len({m.label for m in metrics}) != len(metrics):
        raise _fail(path, "two metrics share a label; give one of them a label")
    return metrics


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file strictly (unknown keys and wrong types name the key at fault).

    Raises:
        ConfigError: a missing file, an unknown key, a wrong type, a variant that sets a runner key, or a
            baseline that names no variant.
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
    seeds = data.get("seeds", DEFAULT_SEEDS)
    if (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise _fail(path, f"seeds = {seeds!r}, expected a non-empty list of distinct integers")
    variants = _variants(path, data)
    baseline = _baseline(path, data, variants)
    overrides = _override_list(path, "overrides", data.get("overrides"))
    results, warmup_seed, comparisons = _design_keys(path, data, variants)
    _check_runner_keys(path, overrides, variants, warmup_seed)
    metrics = _metrics(path, data)
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
                 gpus_per_run=gpus_per_run, baseline=baseline, results=results or Path(out) / "results.jsonl",
                 warmup_seed=warmup_seed, comparisons=comparisons)
