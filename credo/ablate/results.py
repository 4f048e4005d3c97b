"""A sweep's raw results: one JSON line per finished run, the input of every table and of `credo report`.

`credo ablate` writes the line of a run when it finishes, into the sweep's `results` file (default
`<output_dir>/results.jsonl`; the sweeps behind docs/reproductions.md name `docs/results/<name>.jsonl`).
One line (schema 1; keys in this order):

    schema        1
    sweep         the sweep's name
    variant       the variant's name
    seed          run.seed
    sft_seed      the SFT warm-up's seed (null: no warm-up)
    warmup_key    the warm-up's cache key (credo.sft.sft_cache_key; null: no warm-up)
    warmup_sha256 sha256 of the warm-up's weights file: equal on two hosts only if the warm-ups are bitwise equal
    config_hash   hash of the run's resolved recipe (credo.ablate.plan.config_hash)
    overrides     the variant's overrides
    commit        git commit of the working tree when the run started (+dirty when tracked files differed from it)
    date          when the run finished (ISO 8601, local time)
    host          {cpu, cpu_capability, cores, threads, torch, python, platform}: what may change results bitwise
    wall_s        the run's wall time in seconds
    steps         run.steps
    final         metric -> value at the run's last step (every number logged at that step)
    curves        metric -> {step: value}, for the sweep's curves and the keys of its metrics
    values        metric label -> the number the sweep's table uses (the curve reduced as the sweep says)
    sweep_file    the sweep file's path as given to `credo ablate` (credo.ablate.prereg)
    sweep_commit  the last commit of the sweep file when the run started (`git log -1 -- FILE`): the version that
                  named its comparisons; null when exploratory
    exploratory   true when the run was started with `--exploratory` (the sweep file not committed)

Lines written before issue 57 have no sweep_file, sweep_commit or exploratory; `credo report` then establishes
from git, with the line's `commit`, whether a comparison was named before the run (credo.ablate.prereg).

A finished run with no line (its folder predates the results file) is recorded when the sweep is next
invoked: its date is its own (from DONE), its commit and host those of the recording.

Two older shapes are read through the same loader (`read_results` -> `normalize`), so `credo report` takes
every results file under docs/results/ the same way; the file is never rewritten, and every key of the old line
is kept as it was, the schema-1 keys added beside them (`legacy` names the shape):

- `flat` (docs/results/staleness_lr*.jsonl, benchmarks/staleness_lr.py): `sweep`, `variant`, `seed`, the
  evaluation curve as `eval_curve` ([[step, value], ...]) and reduced numbers as flat keys. Read as: curves
  {eval/accuracy: eval_curve}; final {eval/accuracy: the curve's last value}; values {eval/accuracy final,
  eval/accuracy best, train/reward_mean last-5 mean} from `eval/accuracy_final`, `eval/accuracy_best`,
  `train/reward_mean_last5`.
- `arm` (docs/results/shop_sft_vs_rl.jsonl): `arm`, `seed` and `metrics`, the numbers of one evaluation at the
  end of the arm. Read as: sweep the file's name, variant the arm, final the metrics, and each metric a curve of
  one point at step 0 (the step is not recorded), so reductions final, first and best give the number.

A line of neither shape still fails, naming the file, the line and the missing key.

Rerunning a sweep skips a run whose line is present with the same config_hash (its run folder may be gone: a
fresh checkout reruns nothing that is recorded), and replaces the line of a run it reruns. Lines of other
runs and other sweeps are kept. Each write rewrites the file atomically under a lock on its folder, so two
sweeps writing one file do not lose each other's lines.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from credo.config import ConfigError
from credo.tracking import read_metrics

SCHEMA = 1
REQUIRED = ("sweep", "variant", "seed", "final", "curves")


def git_commit(cwd: str | Path = ".") -> str:
    """Short commit of the git work tree at cwd, with +dirty when tracked files differ; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_fingerprint(threads: int) -> dict:
    """What of the host may change a run's numbers bitwise: the CPU, the kernels torch dispatches to, threads."""
    import torch

    return {"cpu": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(terse=True)}


def _warmup_sha256(key: str | None) -> str | None:
    """Digest of the cached warm-up's weights (the file the trainer wrote for `key`), None when absent."""
    if key is None:
        return None
    from credo.models import cache_root
    from credo.sft import file_digest

    folder = cache_root() / "sft" / key
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    return hashlib.sha256("".join(file_digest(f) for f in files).encode()).hexdigest()


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def curves_of(rows: list[dict], keys: list[str]) -> dict[str, dict[str, float]]:
    """metric -> {step (as a string, JSON's key type): value} over the finite logged values of each key."""
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        points = {int(r["step"]): float(r[key]) for r in rows if "step" in r and key in _numbers(r)}
        if points:
            out[key] = {str(s): points[s] for s in sorted(points)}
    return out


def final_of(rows: list[dict]) -> dict[str, float]:
    """Every finite number logged at the run's last step (rows of that step merged)."""
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    if not steps:
        return {}
    merged: dict[str, float] = {}
    for r in rows:
        if r.get("step") == max(steps):
            merged.update(_numbers(r))
    return dict(sorted(merged.items()))


def _finished(run) -> str:
    """When the run finished, from its DONE file (a run recorded after the fact keeps its own date)."""
    try:
        return json.loads((run.run_dir / "DONE").read_text())["finished"]
    except (OSError, ValueError, KeyError):
        return time.strftime("%Y-%m-%dT%H:%M:%S")


def run_record(sweep, run, *, host: dict, commit: str, values: dict[str, float | None], registration: dict) -> dict:
    """The results line of one finished run (schema in this module's docstring)."""
    rows = read_metrics(run.run_dir / "metrics.jsonl")
    keys = list(dict.fromkeys([*sweep.curves, *(m.key for m in sweep.metrics)]))
    sft_on = run.warmup_group is not None
    return {
        "schema": SCHEMA, "sweep": sweep.name, "variant": run.variant, "seed": run.seed,
        "sft_seed": (run.recipe.run.seed if run.recipe.sft.seed is None else run.recipe.sft.seed) if sft_on else None,
        "warmup_key": run.warmup_group, "warmup_sha256": _warmup_sha256(run.warmup_group),
        "config_hash": run.config_hash, "overrides": sweep.variants[run.variant], "commit": commit,
        "date": _finished(run), "host": host, "wall_s": run.wall_s, "steps": run.recipe.run.steps,
        "final": final_of(rows), "curves": curves_of(rows, keys), "values": values,
        "sweep_file": registration.get("sweep_file"), "sweep_commit": registration.get("sweep_commit"),
        "exploratory": bool(registration.get("exploratory")),
    }


def read_results(path: str | Path) -> list[dict]:
    """The records of a results file (none when it does not exist).

    Raises:
        ConfigError: a line that is not a JSON object with the required keys, naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"results file '{path}', line {i}: not valid JSON ({e.msg})") from None
        rec = normalize(rec, path)
        missing = [k for k in REQUIRED if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise ConfigError(f"results file '{path}', line {i}: missing key '{missing[0]}' (expected one run per line "
                              f"with {', '.join(REQUIRED)})")
        out.append(rec)
    return out


FLAT_VALUES = {"eval/accuracy_final": "eval/accuracy final", "eval/accuracy_best": "eval/accuracy best",
               "train/reward_mean_last5": "train/reward_mean last-5 mean"}
"""A flat line's reduced numbers and the labels `credo report` gives the same reductions."""


def normalize(rec, path: Path):
    """A results line in schema 1: a schema-1 line as it is, a `flat` or `arm` line (this module's docstring) with
    the schema-1 keys added beside its own; anything else unchanged (read_results then names what is missing)."""
    if not isinstance(rec, dict) or "schema" in rec:
        return rec
    if {"sweep", "variant", "seed", "eval_curve"} <= rec.keys() and "final" not in rec:
        curve = {str(int(s)): float(v) for s, v in rec["eval_curve"]}
        last = curve[max(curve, key=int)] if curve else None
        return rec | {"legacy": "flat", "final": {} if last is None else {"eval/accuracy": last},
                      "curves": {"eval/accuracy": curve} if curve else {},
                      "values": {label: rec[k] for k, label in FLAT_VALUES.items() if k in rec}}
    if {"arm", "seed", "metrics"} <= rec.keys() and "variant" not in rec:
        numbers = _numbers(rec["metrics"]) if isinstance(rec["metrics"], dict) else {}
        return rec | {"legacy": "arm", "sweep": path.stem, "variant": rec["arm"], "final": dict(sorted(numbers.items())),
                      "curves": {k: {"0": v} for k, v in sorted(numbers.items())}}
    return rec


@contextmanager
def _folder_lock(folder: Path):
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _identity(rec: dict) -> tuple:
    return rec["sweep"], rec["variant"], rec["seed"]


def upsert_results(path: str | Path, records: list[dict]) -> None:
    """Write `records` into the results file: each replaces the line of the same (sweep, variant, seed) in
    place, or is appended; every other line is kept. Atomic, under a lock on the file's folder."""
    if not records:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_lock(path.parent):
        existing = read_results(path)
        new = {_identity(r): r for r in records}
        merged = [new.pop(_identity(r), r) for r in existing] + list(new.values())
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in merged))
        os.replace(tmp, path)


def curve_points(rec: dict, key: str) -> list[tuple[int, float]]:
    """One record's curve of `key` as (step, value) pairs sorted by step."""
    return sorted((int(s), float(v)) for s, v in (rec.get("curves", {}).get(key) or {}).items())
