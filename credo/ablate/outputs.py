"""What `credo ablate` writes about a sweep's finished runs: their results lines, table.md, table.csv, curves.png.

The tables are made from the results records (credo.ablate.results), never from the run folders directly, so
`credo report` on the committed results file gives the same tables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from credo.ablate.plan import Run
from credo.ablate.prereg import mark_named
from credo.ablate.report import Summary, plot_curves, reduce_metric, summarize_records
from credo.ablate.results import git_commit, host_fingerprint, read_results, run_record, upsert_results
from credo.ablate.spec import Sweep
from credo.ablate.tables import render_csv, render_markdown
from credo.tracking import read_metrics


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def recorded(sweep: Sweep, runs: list[Run]) -> dict[tuple[str, int], dict]:
    """(variant, seed) -> the results line of a planned run made with the run's current config."""
    want = {(r.variant, r.seed): r.config_hash for r in runs}
    return {(rec["variant"], rec["seed"]): rec for rec in read_results(sweep.results)
            if rec["sweep"] == sweep.name and want.get((rec["variant"], rec["seed"])) == rec.get("config_hash")}


def record_runs(sweep: Sweep, runs: list[Run]) -> None:
    """Write (or replace) the results lines of these finished runs, read from their run folders."""
    if not runs:
        return
    host, commit = host_fingerprint(runs[0].recipe.run.threads), git_commit()
    records = []
    for run in runs:
        rows = read_metrics(run.run_dir / "metrics.jsonl")
        values = {m.label: reduce_metric(rows, m) for m in sweep.metrics}
        started = _started_with(run)
        # the sweep file's registration as the run started (a run recorded after the fact: as found now)
        reg = {k: started.get(k, sweep.registration.get(k)) for k in ("sweep_file", "sweep_commit", "exploratory")}
        records.append(run_record(sweep, run, host={**host, "threads": started.get("threads", run.recipe.run.threads)},
                                  commit=started.get("commit", commit), values=values, registration=reg))
    upsert_results(sweep.results, records)


def _started_with(run: Run) -> dict:
    """The commit and run.threads the run was started with (sweep_run.json), where known: a run's code is its
    start's, and a run recorded after the fact may have run with other threads than today's plan gives."""
    try:
        started = json.loads((run.run_dir / "sweep_run.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {"commit": started["commit"]} if isinstance(started.get("commit"), str) else {}
    out |= {k: started[k] for k in ("sweep_file", "sweep_commit", "exploratory") if k in started}
    threads = (started.get("config") or {}).get("run", {}).get("threads")
    return out | ({"threads": int(threads)} if isinstance(threads, int) else {})


def sweep_summary(sweep: Sweep, runs: list[Run]) -> Summary:
    """The statistics of the sweep's recorded runs (those made with the sweep file's current config)."""
    records = list(recorded(sweep, runs).values())
    order = {(r.variant, r.seed): i for i, r in enumerate(runs)}
    records.sort(key=lambda rec: order[(rec["variant"], rec["seed"])])
    return mark_named(summarize_records(records, sweep.metrics, variants=list(sweep.variants), baseline=sweep.baseline,
                                        comparisons=sweep.comparisons), [sweep.path])


def write_outputs(sweep: Sweep, runs: list[Run]) -> Summary:
    """table.md, table.csv and (when a run is recorded) curves.png in the sweep's output_dir."""
    summary = sweep_summary(sweep, runs)
    head = [f"# {sweep.name}", ""] + ([sweep.description, ""] if sweep.description else [])
    head += [f"Base recipe `{sweep.base}`, seeds {sweep.seeds}" + (f", baseline `{sweep.baseline}`" if sweep.baseline else "")
             + f"; sweep file `{sweep.path}`; results `{sweep.results}` (`credo report {sweep.path}` remakes this table).", ""]
    tail = ["Variants:", ""] + [f"- `{v}`: " + (" ".join(f"`{o}`" for o in ov) or "the base recipe")
                                for v, ov in sweep.variants.items()]
    if sweep.overrides:
        tail += ["", "Every run: " + " ".join(f"`{o}`" for o in sweep.overrides)]
    atomic_write(sweep.output_dir / "table.md", "\n".join(head) + "\n" + render_markdown(summary) + "\n" + "\n".join(tail) + "\n")
    atomic_write(sweep.output_dir / "table.csv", render_csv(summary))
    if summary.records:
        keys = sweep.curves or list(dict.fromkeys(m.key for m in sweep.metrics))
        plot_curves(summary.records, keys, list(sweep.variants), sweep.output_dir / "curves.png", sweep.name)
    return summary
