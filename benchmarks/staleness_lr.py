"""The staleness-learning-rate law (arXiv 2607.01083) on credo's fixed_lag asynchrony: run a sweep, detect collapses,
fit log eta_max against log S and check M_collapse * S * eta.

    python benchmarks/staleness_lr.py run recipes/ablations/staleness_lr.yaml        # every run, in this process
    python benchmarks/staleness_lr.py analyze recipes/ablations/staleness_lr.yaml \\
        --results docs/results/staleness_lr.jsonl --plot docs/img/staleness_lr.png

`run` trains the sweep's runs one after another in one process (the run folders `credo ablate` would write; a run
whose metrics reach its last step is skipped), which spares a process start-up per run on a small machine.
`analyze` reads the run folders:

- collapse: the first evaluation whose held-out accuracy is below COLLAPSE_FRAC of the best accuracy seen so far (at
  that step or before, step 0 included), or a run stopped early by non-finite values; M_collapse is that step;
- eta_max(S, seed): the largest learning rate of the grid below which no rate collapsed (None when the smallest
  collapsed; the largest rate, marked censored, when none did);
- the fit: least squares of log eta_max on log S over S >= 1 (uncensored points), the slope with its 95% t-interval
  (the paper: -1);
- M_collapse * S * eta over the collapsed runs with S >= 1: its mean per S and its spread (the paper: a constant).

Each run becomes one JSON line of --results (sweep, variant, seed, S, lr, commit, date, host, final metrics, the
eval curve, collapse).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COLLAPSE_FRAC = 0.5
"""A run has collapsed at the first evaluation whose accuracy is below this fraction of its best so far."""


class Collapsed(Exception):
    """Raised from the tracker when a run's evaluation meets the collapse rule (with --stop-at-collapse)."""


def run_all(sweep_path: str, only: list[str] | None, staleness: list[int] | None = None,
            seeds: list[int] | None = None, adaptive: bool = False) -> None:
    """Train the sweep's runs (those of `only` variants, `staleness` values and `seeds` when given).

    `adaptive`: for each (S, seed) the learning rates go in descending order, each run stops at its collapse (the rest
    of a collapsed run tells neither eta_max nor M_collapse), and the first rate that does not collapse ends the
    group: the smaller ones are taken not to collapse either (the monotonicity eta_max rests on). That is every run
    eta_max and M_collapse need, at a fraction of the grid's cost."""
    from credo.ablate.plan import plan_runs
    from credo.ablate.spec import load_sweep

    sweep = load_sweep(sweep_path)
    runs = [r for r in plan_runs(sweep, threads=1) if (not only or r.variant in only)
            and (staleness is None or r.recipe.rollout.max_staleness in staleness)
            and (seeds is None or r.seed in seeds)]
    if adaptive:  # (seed, S) groups in turn, each by descending learning rate
        runs.sort(key=lambda r: (r.seed, r.recipe.rollout.max_staleness, -r.recipe.optim.lr))
    stop: set[tuple[int, int]] = set()  # (S, seed) groups with a rate that did not collapse
    for i, r in enumerate(runs):
        group = (r.recipe.rollout.max_staleness, r.seed)
        if adaptive and group in stop:
            continue
        train_one(r, f"[{i + 1}/{len(runs)}] {r.variant} seed {r.seed}", stop_at_collapse=adaptive)
        if adaptive and not collapsed(r.run_dir):
            stop.add(group)


def train_one(r, label: str, *, stop_at_collapse: bool) -> None:
    """One run of the sweep, unless its metrics already reach its last step (or it was stopped: non-finite values, or
    its collapse with `stop_at_collapse`); an unfinished run starts again from scratch."""
    import shutil

    from credo.errors import TrainingError
    from credo.trainer import Trainer

    done = ("STOPPED", "COLLAPSED")
    if last_step(r.run_dir) == r.recipe.run.steps or any((r.run_dir / f).exists() for f in done):
        return
    if r.run_dir.exists():
        shutil.rmtree(r.run_dir)
    t = time.perf_counter()
    print(label, flush=True)
    trainer = Trainer(r.recipe)
    # the run's provenance, for analyze (which may run later, at another commit)
    from credo.ablate.results import git_commit

    (r.run_dir / "started.json").write_text(json.dumps({"commit": git_commit(REPO), "date": time.strftime("%Y-%m-%d")}))
    if stop_at_collapse:
        watch_collapse(trainer)
    try:
        trainer.fit()
    except TrainingError as e:  # non-finite values: a collapse too
        (r.run_dir / "STOPPED").write_text(str(e) + "\n")
        print(f"  stopped: {e}", flush=True)
    except Collapsed as e:
        (r.run_dir / "COLLAPSED").write_text(str(e) + "\n")
        print(f"  {e}", flush=True)
    finally:
        trainer.close()
    print(f"  {time.perf_counter() - t:.0f} s", flush=True)


def watch_collapse(trainer) -> None:
    """Make the trainer's tracker raise Collapsed right after it logs the evaluation that meets the collapse rule."""
    log, curve = trainer.tracker.log, []

    def log_and_watch(row: dict) -> None:
        log(row)
        if "eval/accuracy" in row:
            curve.append((row["step"], row["eval/accuracy"]))
            step = collapse_step(curve, None)
            if step is not None:
                best = max(a for _, a in curve)
                raise Collapsed(f"collapsed at step {step} (eval/accuracy {curve[-1][1]:.3f}, best {best:.3f})")

    trainer.tracker.log = log_and_watch


def collapsed(run_dir: Path) -> bool:
    rows = rows_of(run_dir)
    curve = [(row["step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]
    return (run_dir / "STOPPED").exists() or collapse_step(curve, None) is not None


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step(run_dir: Path) -> int:
    return max((r.get("step", -1) for r in rows_of(run_dir)), default=-1)


def collapse_step(curve: list[tuple[int, float]], stopped_at: int | None) -> int | None:
    """The first evaluation step whose accuracy is below COLLAPSE_FRAC of the best so far; else the step a run was
    stopped at by non-finite values; else None."""
    best = -1.0
    for step, acc in curve:
        best = max(best, acc)
        if best > 0 and acc < COLLAPSE_FRAC * best:
            return step
    return stopped_at


def eta_max(lrs_collapsed: dict[float, bool]) -> tuple[float | None, bool]:
    """(the largest rate below which none collapsed, censored: no rate of the grid collapsed)."""
    best = None
    for lr in sorted(lrs_collapsed):
        if lrs_collapsed[lr]:
            return best, False
        best = lr
    return best, True


def t_quantile_975(df: int) -> float:
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
             12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
    if df in table:
        return table[df]
    below = [k for k in table if k < df]
    return table[max(below)] if below else 1.96


def fit_slope(points: list[tuple[float, float]]) -> dict:
    """Least squares y = a + b x; b with its standard error and 95% t-interval."""
    n = len(points)
    if n < 3 or len({x for x, _ in points}) < 2:
        return {"n": n, "slope": None}
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    resid = sum((y - a - b * x) ** 2 for x, y in points)
    se = math.sqrt(resid / (n - 2) / sxx) if n > 2 else float("nan")
    h = t_quantile_975(n - 2) * se
    return {"n": n, "slope": b, "intercept": a, "se": se, "ci95": [b - h, b + h]}


def provenance(run_dir: Path, run_commit: str | None) -> dict:
    """The commit and date the run trained at: its started.json (written by `run`); for a folder without one, the
    date of its metrics file and `--run-commit` (else HEAD, marked as the commit analyze ran at)."""
    from credo.ablate.results import git_commit

    started = run_dir / "started.json"
    if started.exists():
        return json.loads(started.read_text())
    date = time.strftime("%Y-%m-%d", time.gmtime((run_dir / "metrics.jsonl").stat().st_mtime))
    return {"commit": run_commit or f"{git_commit(REPO)} (analyzed; run commit not recorded)", "date": date}


def analyze(sweep_path: str, results: str | None, plot: str | None, run_commit: str | None = None) -> dict:
    from credo.ablate.plan import plan_runs
    from credo.ablate.spec import load_sweep

    sweep = load_sweep(sweep_path)
    lines, table = [], {}
    for r in plan_runs(sweep, threads=1):
        rows = rows_of(r.run_dir)
        ended = last_step(r.run_dir) == r.recipe.run.steps or \
            any((r.run_dir / f).exists() for f in ("STOPPED", "COLLAPSED"))
        if not rows or not ended:  # not run, or still running: it says nothing yet
            continue
        S, lr = r.recipe.rollout.max_staleness, r.recipe.optim.lr
        curve = [(row["step"], row["eval/accuracy"]) for row in rows if "eval/accuracy" in row]
        stopped = (r.run_dir / "STOPPED").exists()
        m = collapse_step(curve, last_step(r.run_dir) + 1 if stopped else None)
        train_rows = [row for row in rows if "train/reward_mean" in row]
        final = {"eval/accuracy_final": curve[-1][1] if curve else None,
                 "eval/accuracy_best": max(a for _, a in curve) if curve else None,
                 "train/reward_mean_last5": sum(x["train/reward_mean"] for x in train_rows[-5:])
                 / max(1, len(train_rows[-5:])),
                 "train/grad_norm_max": max((x.get("train/grad_norm", 0.0) for x in train_rows), default=None)}
        lines.append({"sweep": sweep.name, "variant": r.variant, "seed": r.seed, "S": S, "lr": lr,
                      "staleness_lr_scaling": r.recipe.optim.staleness_lr_scaling,
                      **provenance(r.run_dir, run_commit), "host": f"{platform.node()} ({platform.machine()}, 2 cores)",
                      "steps": r.recipe.run.steps, "finished": last_step(r.run_dir) == r.recipe.run.steps,
                      "stopped_non_finite": stopped, "stopped_at_collapse": (r.run_dir / "COLLAPSED").exists(),
                      "collapsed": m is not None, "M_collapse": m, **final,
                      "eval_curve": curve})
        table.setdefault((S, r.seed), {})[lr] = m is not None
    summary = summarize(lines, table)
    if results:
        Path(results).parent.mkdir(parents=True, exist_ok=True)
        Path(results).write_text("".join(json.dumps(x) + "\n" for x in lines))
    if plot:
        draw(lines, summary, plot)
    print(json.dumps(summary, indent=1))
    return summary


def summarize(lines: list[dict], table: dict) -> dict:
    etas = {}
    for (S, seed), by_lr in sorted(table.items()):
        eta, censored = eta_max(by_lr)
        etas[f"S={S},seed={seed}"] = {"S": S, "seed": seed, "eta_max": eta, "censored": censored}
    points = [(math.log(v["S"]), math.log(v["eta_max"])) for v in etas.values()
              if v["S"] >= 1 and v["eta_max"] is not None and not v["censored"]]
    products: dict[int, list[float]] = {}
    for x in lines:
        if x["collapsed"] and x["S"] >= 1:
            products.setdefault(x["S"], []).append(x["M_collapse"] * x["S"] * x["lr"])
    rate, steps = {}, {}
    for x in lines:
        rate.setdefault(f"S={x['S']},lr={x['lr']}", []).append(x["collapsed"])
        steps.setdefault(f"S={x['S']},lr={x['lr']}", []).append(x["M_collapse"])
    return {"collapse_rule": f"eval/accuracy < {COLLAPSE_FRAC} x best so far, or stopped by non-finite values",
            "collapsed_frac": {k: sum(v) / len(v) for k, v in rate.items()},
            "M_collapse_by_seed": steps,
            "eta_max": etas, "fit_log_eta_max_vs_log_S": fit_slope(points),
            "M_collapse_S_eta": {S: {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}
                                 for S, v in sorted(products.items())}}


def draw(lines: list[dict], summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = sorted({x["lr"] for x in lines})
    Ss = sorted({x["S"] for x in lines})
    fig, axes = plt.subplots(1, len(lrs) + 1, figsize=(4 * (len(lrs) + 1), 3.4))
    colours = plt.get_cmap("viridis")
    for ax, lr in zip(axes, lrs):
        for i, S in enumerate(Ss):
            for x in (y for y in lines if y["lr"] == lr and y["S"] == S):
                steps, acc = zip(*x["eval_curve"]) if x["eval_curve"] else ((), ())
                ax.plot(steps, acc, color=colours(i / max(1, len(Ss) - 1)), alpha=0.7,
                        label=f"S={S}" if x["seed"] == min(z["seed"] for z in lines) else None)
        ax.set_title(f"lr {lr:g}")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("held-out accuracy")
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    etas = [v for v in summary["eta_max"].values() if v["S"] >= 1 and v["eta_max"] is not None]
    ax.scatter([v["S"] for v in etas], [v["eta_max"] for v in etas],
               c=["grey" if v["censored"] else "black" for v in etas])
    fit = summary["fit_log_eta_max_vs_log_S"]
    if fit.get("slope") is not None:
        xs = [1, max(Ss)]
        ax.plot(xs, [math.exp(fit["intercept"]) * x ** fit["slope"] for x in xs],
                label=f"fit slope {fit['slope']:.2f} [{fit['ci95'][0]:.2f}, {fit['ci95'][1]:.2f}]")
        ax.plot(xs, [math.exp(fit["intercept"]) * x ** -1 for x in xs], "--", label="slope -1 (paper)")
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("S (max staleness)")
    ax.set_ylabel("eta_max")
    ax.set_title("largest stable lr (grey: censored)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("run")
    a.add_argument("sweep")
    a.add_argument("--only", nargs="*", help="variant names (default: all)")
    a.add_argument("--staleness", nargs="*", type=int, help="only these values of rollout.max_staleness")
    a.add_argument("--seeds", nargs="*", type=int, help="only these seeds")
    a.add_argument("--adaptive", action="store_true",
                   help="per (S, seed): descending learning rates, each stopped at its collapse, up to the first that "
                        "does not")
    b = sub.add_parser("analyze")
    b.add_argument("sweep")
    b.add_argument("--results")
    b.add_argument("--plot")
    b.add_argument("--run-commit", help="the commit the runs trained at, for run folders without started.json")
    args = p.parse_args()
    if args.cmd == "run":
        run_all(args.sweep, args.only, args.staleness, args.seeds, args.adaptive)
    else:
        analyze(args.sweep, args.results, args.plot, args.run_commit)


if __name__ == "__main__":
    main()
