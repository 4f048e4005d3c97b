"""Running a sweep's runs: one process per run, N at once, resumable, then the tables.

`--jobs N` runs (default: one per CPU core, or one per gpus_per_run GPUs) go at once, each with run.threads
and OMP_NUM_THREADS set to cores // jobs (divided again by gpus_per_run under a launcher), so the cores are
not oversubscribed. Each run's output goes to `log.txt` in its folder. Runs start seed by seed (every
variant of the first seed, then of the next), so a sweep stopped early leaves whole seeds.

Resuming: a run is finished when its process exited 0 and its metrics.jsonl holds the step run.steps;
the runner then writes `DONE` (with the run's config hash) into its folder and the run's line into the
sweep's results file (credo.ablate.results). Invoking the same sweep again skips finished runs (and runs
whose results line has the current config hash, even when their folder is gone), resumes unfinished or failed ones with run.resume=auto (from their newest
good checkpoint), and restarts from scratch an unfinished run whose config has changed. A finished run
whose config has changed stops the sweep before anything starts (its results would no longer match the
sweep file). Runs that share a warm-up (same model, task, sft and seed) wait for the first of them to
finish the warm-up, so it is trained once and then read from the cache.

The module runs a little past 400 lines: the plan, the resume rules, the lock and the scheduler loop are one
protocol (each relies on the others' files), read together.

Besides the tables and curves (credo.ablate.outputs, made from the results records), output_dir holds `sweep.json` (each run's
overrides, config hash, status, exit code and, for a failed run, the end of its log) and a copy of the
sweep file. A failed run is reported with the last lines of its log; the table holds the others.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from credo.ablate.outputs import atomic_write, record_runs, recorded, write_outputs
from credo.ablate.plan import RESULT_NEUTRAL, Run, plan_runs
from credo.ablate.prereg import registration
from credo.ablate.results import git_commit
from credo.ablate.spec import Sweep, _fail, load_sweep
from credo.config import ConfigError, recipe_to_dict
from credo.tracking import read_metrics

LOG_TAIL_LINES = 15
ATTEMPT_MARK = "=== credo ablate: attempt "


# ------------------------------------------------------------------------------------------ resuming


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


def write_sweep_json(sweep: Sweep, runs: list[Run], *, jobs: int, threads: int) -> None:
    """sweep.json in output_dir: the sweep's settings and each run's overrides, config hash and status."""
    data = {
        "name": sweep.name, "sweep_file": str(sweep.path), "base": str(sweep.base), "seeds": sweep.seeds,
        "variants": sweep.variants, "baseline": sweep.baseline, "overrides": sweep.overrides, "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "jobs": jobs, "threads_per_run": threads,
        "runs": [{"variant": r.variant, "seed": r.seed, "run_dir": str(r.run_dir.relative_to(sweep.output_dir)),
                  "config_hash": r.config_hash, "status": r.status, "exit_code": r.exit_code, "wall_s": r.wall_s,
                  "overrides": r.overrides, **({"error_tail": r.error_tail} if r.error_tail else {})} for r in runs],
    }
    atomic_write(sweep.output_dir / "sweep.json", json.dumps(data, indent=1) + "\n")


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
    reg = dict(sweep.registration)
    if _read_json(run.run_dir / "sweep_run.json").get("exploratory"):  # resumed: an exploratory start stays one
        reg |= {"exploratory": True, "sweep_commit": None}
    atomic_write(run.run_dir / "sweep_run.json", json.dumps(
        {"variant": run.variant, "seed": run.seed, "config_hash": run.config_hash, "argv": argv, "commit": git_commit(),
         "config": recipe_to_dict(run.recipe)} | reg, indent=1) + "\n")
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


def _finish(job: _Job, rc: int, sweep: Sweep) -> None:
    run = job.run
    job.log.close()
    run.exit_code, run.wall_s = rc, round(time.time() - job.started, 1)
    if rc == 0 and finished_ok(run):
        run.status, run.error_tail = "done", ""
        atomic_write(run.run_dir / "DONE", json.dumps({"config_hash": run.config_hash, "wall_s": run.wall_s,
                                                        "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        record_runs(sweep, [run])
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


class PlainSweepProgress:
    """The sweep's progress without a terminal (a log file, a pipe): the finished-run lines as they come and a status
    line every `heartbeat_s`, never tqdm's `\r` redraws, which filled a sweep's log with one line per poll."""

    def __init__(self, name: str, total: int, initial: int, heartbeat_s: float = 300.0):
        self.name, self.total, self.n, self.heartbeat_s = name, total, initial, heartbeat_s
        self.t0 = self.last = time.monotonic()
        self.post: dict = {}

    def update(self, k: int) -> None:
        self.n += k

    def write(self, line: str) -> None:
        print(f"{line} [{self.n}/{self.total} runs]", file=sys.stderr, flush=True)

    def set_postfix(self, refresh: bool = False, **post) -> None:
        self.post = post

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.heartbeat_s:
            self.last = now
            extra = "".join(f", {k} {v}" for k, v in self.post.items())
            print(f"ablate {self.name}: {self.n}/{self.total} runs finished{extra}, {(now - self.t0) / 60:.0f} min",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress(name: str, total: int, initial: int):
    """tqdm on a terminal; `PlainSweepProgress` when stderr is a file or a pipe (as credo.tracking's run bar)."""
    if not sys.stderr.isatty():
        return PlainSweepProgress(name, total, initial)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=f"ablate {name}", unit="run", dynamic_ncols=True)


def _schedule(runs: list[Run], sweep: Sweep, *, jobs: int, lock_fd: int, gpus: list[str], poll_s: float) -> None:
    # seed by seed: the variants of a seed (which share its warm-up) finish close together, so a sweep stopped
    # early leaves whole seeds, the pairs of a paired comparison
    seeds = {s: i for i, s in enumerate(sweep.seeds)}
    pending = sorted((r for r in runs if r.action in ("new", "resume", "restart")), key=lambda r: seeds[r.seed])
    warm = {r.warmup_group for r in runs if r.action == "done"}
    running: list[_Job] = []
    bar = _progress(sweep.name, len(runs), len(runs) - len(pending))
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
                _finish(job, rc, sweep)
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


def _classify_all(sweep: Sweep, runs: list[Run]) -> dict:
    """Each run's action; a run recorded in the results file with its current config is done. Returns those records."""
    in_results = recorded(sweep, runs)
    for r in runs:
        r.action = classify(r)
        if r.action != "stale" and (r.variant, r.seed) in in_results:  # recorded with this config: no rerun
            r.action, r.wall_s = "done", in_results[(r.variant, r.seed)].get("wall_s")
        elif r.action == "done":
            r.wall_s = _read_json(r.run_dir / "DONE").get("wall_s")
        r.status = "done" if r.action == "done" else r.status
    return in_results


def _print_plan(runs: list[Run], sweep: Sweep, *, jobs: int, threads: int) -> None:
    todo = [r for r in runs if r.action != "done"]
    print(f"sweep {sweep.name}: {len(sweep.variants)} variants x {len(sweep.seeds)} seeds = {len(runs)} runs, "
          f"{len(runs) - len(todo)} finished, {len(todo)} to run ({jobs} at once, {threads} thread(s) each); "
          f"output {sweep.output_dir}" + (f"; differences against baseline {sweep.baseline}" if sweep.baseline else ""))
    for r in runs:
        print(f"  [{r.action:7s}] {r.variant}/seed{r.seed}  " + " ".join(sweep.variants[r.variant]))
    if todo:
        print("first command: " + " ".join(_train_argv(sweep.base, _invocation_overrides(todo[0]), sweep.launcher)))


def _refuse_stale(sweep, runs) -> None:
    """A ConfigError listing the finished runs made with another config than the sweep file now gives."""
    stale = [r for r in runs if r.action == "stale"]
    if stale:
        lines = [f"  {r.run_dir}: " + ("; ".join(r.stale_diff[:4]) or "config hash differs") for r in stale]
        raise _fail(sweep.path, f"{len(stale)} finished run(s) were made with a different config than the sweep file now "
                                "gives:\n" + "\n".join(lines) + "\nexpected the same config; delete those run folders to "
                                "rerun them, or set a new output_dir")


def _lock_sweep(sweep):
    """The sweep folder's lock file, held (exclusive); None, with a message, when another `credo ablate` holds it."""
    lock = open(sweep.output_dir / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        print(f"credo: error: sweep folder {sweep.output_dir} is in use by another `credo ablate` (or by runs it started "
              "that are still going); wait for them or stop them, then invoke again", file=sys.stderr)
        return None
    return lock


def _report_runs(sweep, runs) -> list:
    """Print the failed runs' log tails, the table and the summary line; return the failed runs."""
    failed = [r for r in runs if r.status == "failed"]
    for r in failed:
        print(f"\nrun {r.variant}/seed{r.seed} failed (exit {r.exit_code}); last lines of {r.run_dir / 'log.txt'}:\n"
              + "\n".join("  | " + l for l in r.error_tail.splitlines()), file=sys.stderr)
    print("\n" + (sweep.output_dir / "table.md").read_text())
    n_done = sum(r.status == "done" for r in runs)
    print(f"credo ablate: {n_done}/{len(runs)} runs finished, {len(failed)} failed; table in {sweep.output_dir / 'table.md'}, "
          f"results in {sweep.results}")
    return failed


def _schedule_with_signals(sweep, runs, *, jobs: int, threads: int, lock, gpus, poll_s: float) -> int:
    """Run the scheduler with SIGTERM turned into an interruption; write sweep.json, the table and curves and
    release the lock whatever happens. Returns 130 when interrupted, else 0."""
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
        write_outputs(sweep, runs)
        lock.close()
    return code


def run_sweep(path: str | Path, *, jobs: int = 0, dry_run: bool = False, poll_s: float = 0.5,
              exploratory: bool = False) -> int:
    """Run (or, with dry_run, list) a sweep's runs, then write its table, curves and sweep.json.

    Args:
        path: the sweep YAML file (format in `credo.ablate.spec`).
        jobs: runs at once; 0 means one per GPU, or one per CPU core.
        dry_run: list the runs and what would happen to each; start nothing, write nothing.
        poll_s: seconds between checks on the running processes.
        exploratory: run a sweep file that is not committed (credo.ablate.prereg); every results line and table
            made from these runs is marked exploratory. Without it such a sweep is refused.

    Returns:
        Exit code: 0 when every run finished, 1 when some failed (or the folder is busy), 130 when interrupted.

    Raises:
        ConfigError: the sweep file or any run's overrides are invalid, a finished run's config changed, or the
            sweep file is not committed and `exploratory` is not set.
    """
    sweep = load_sweep(path)
    try:
        sweep.registration = registration(sweep.path, exploratory=exploratory)
    except ConfigError as e:
        if not dry_run:
            raise
        print(f"credo ablate: note: a real run would be refused: {e}", file=sys.stderr)
    n_runs = len(sweep.variants) * len(sweep.seeds)
    gpus = _gpu_ids()
    cores = _cpu_count()
    jobs = jobs if jobs > 0 else (len(gpus) // sweep.gpus_per_run if gpus else cores)
    jobs = max(1, min(jobs, n_runs))
    procs = sweep.gpus_per_run if sweep.launcher else 1  # a launcher starts a process per GPU
    threads = max(1, cores // (jobs * procs))
    runs = plan_runs(sweep, threads=threads, build=not dry_run)
    in_results = _classify_all(sweep, runs)
    _refuse_stale(sweep, runs)
    if dry_run:
        _print_plan(runs, sweep, jobs=jobs, threads=threads)
        from credo.tracking import tracked_in_git  # the one line on what a real run writes where (issue 57 A.8)

        print(f"a real run appends one line per finished run to {sweep.results}"
              + (", a file committed in git: the new lines show in `git diff`" if tracked_in_git(sweep.results) else ""))
        return 0
    if jobs > cores:
        print(f"credo ablate: warning: {jobs} jobs on {cores} cores; each run gets 1 thread and the cores are oversubscribed",
              file=sys.stderr)
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_sweep(sweep)
    if lock is None:
        return 1
    # finished runs whose results line is missing (a deleted results file, runs from before it existed)
    record_runs(sweep, [r for r in runs if r.action == "done" and (r.variant, r.seed) not in in_results])
    if sweep.path.resolve() != (sweep.output_dir / "sweep.yaml").resolve():
        shutil.copyfile(sweep.path, sweep.output_dir / "sweep.yaml")
    _print_plan(runs, sweep, jobs=jobs, threads=threads)
    write_sweep_json(sweep, runs, jobs=jobs, threads=threads)

    code = _schedule_with_signals(sweep, runs, jobs=jobs, threads=threads, lock=lock, gpus=gpus, poll_s=poll_s)
    failed = _report_runs(sweep, runs)
    return code or (1 if failed else 0)
