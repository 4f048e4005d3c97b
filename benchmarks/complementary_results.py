"""The raw results of the Complementary RL sweep (docs/results/complementary.jsonl) from a sweep folder.

    python benchmarks/complementary_results.py /path/to/runs/ablations/complementary
    credo report recipes/ablations/complementary.yaml            # the tables (means, intervals, Holm)
    python benchmarks/complementary_results.py --welch docs/results/complementary.jsonl   # unpaired differences

`credo ablate recipes/ablations/complementary.yaml` writes these lines itself as each run finishes; this script
writes them for a sweep that ran in another folder (another worktree, another machine): it plans the sweep's runs
as `credo ablate` does (credo.ablate.plan), takes each run folder under SWEEP_DIR/runs/<variant>/seed<k> whose DONE
file names the planned run's config hash (finished, with this recipe), and records it with credo.ablate's own
writer (schema 1, credo.ablate.results; commit as the run started, from its sweep_run.json). Unfinished runs, and
runs made with another config, are listed on stderr and left out. So `credo report` reads the file as it reads a
file the sweep wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from credo.ablate.outputs import record_runs
from credo.ablate.plan import plan_runs
from credo.ablate.spec import load_sweep


def finished_runs(sweep, runs) -> tuple[list, list[str]]:
    """The planned runs whose folder holds a DONE with the run's config hash (wall_s from it); and why the others
    are left out."""
    done, left = [], []
    for run in runs:
        marker = run.run_dir / "DONE"
        info = json.loads(marker.read_text()) if marker.exists() else None
        if info is None:
            left.append(f"{run.variant}/seed{run.seed}: not finished (no DONE)")
        elif info.get("config_hash") != run.config_hash:
            left.append(f"{run.variant}/seed{run.seed}: made with another config ({info.get('config_hash')} != "
                        f"{run.config_hash})")
        else:
            run.wall_s = info.get("wall_s")
            done.append(run)
    return done, left


def welch(path: str, metric: str = "eval/return", baseline: str = "outcome_only") -> None:
    """Per variant, the Welch (unpaired) difference of the final `metric` against `baseline`, Holm over the
    variants; and the paired difference, for the record beside credo report's table (which pairs by seed)."""
    from credo.ablate.results import read_results
    from credo.ablate.stats import holm, paired_diff, welch_diff

    by: dict[str, dict[int, float]] = {}
    for rec in read_results(path):
        by.setdefault(rec["variant"], {})[rec["seed"]] = rec["final"][metric]
    base = by[baseline]
    others = [v for v in by if v != baseline]
    ws = [welch_diff(list(by[v].values()), list(base.values())) for v in others]
    for v, w, adj in zip(others, ws, holm([w.p for w in ws])):
        seeds = sorted(set(by[v]) & set(base))
        pd = paired_diff([by[v][s] for s in seeds], [base[s] for s in seeds])
        relative = w.diff / (sum(base.values()) / len(base))
        print(f"{v} - {baseline} ({metric} final, n = {len(by[v])} vs {len(base)}): "
              f"Welch {w.diff:+.3f} [{w.low:+.3f}, {w.high:+.3f}] p {w.p:.3f} Holm {adj:.3f}; "
              f"paired (n = {len(seeds)}) {pd.diff:+.3f} [{pd.low:+.3f}, {pd.high:+.3f}] p {pd.p:.3f}; "
              f"relative {relative:+.1%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", nargs="?", help="the sweep's output folder (it holds runs/<variant>/seed<k>)")
    p.add_argument("--welch", metavar="RESULTS", help="print the Welch differences of a results file, and stop")
    p.add_argument("--sweep", default="recipes/ablations/complementary.yaml", help="the sweep file")
    p.add_argument("--out", default=None, help="the results file (default: the sweep's `results`)")
    a = p.parse_args(argv)
    if a.welch:
        welch(a.welch)
        return 0
    if not a.sweep_dir:
        p.error("the sweep folder is required (or --welch RESULTS)")
    sweep = load_sweep(a.sweep)
    sweep = dataclasses.replace(sweep, output_dir=Path(a.sweep_dir),
                                results=Path(a.out) if a.out else sweep.results)
    runs = plan_runs(sweep, threads=1)
    done, left = finished_runs(sweep, runs)
    for line in left:
        print(f"left out: {line}", file=sys.stderr)
    record_runs(sweep, done)
    counts = {v: sum(r.variant == v for r in done) for v in sweep.variants}
    print(f"{sweep.results}: {len(done)} runs recorded; seeds per variant: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
