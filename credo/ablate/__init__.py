"""`credo ablate SWEEP.yaml`: run recipe variants over seeds as separate processes and tabulate them;
`credo report`: remake the tables and curves from the committed results.

- `credo.ablate.spec`: the sweep file (format in its docstring), read strictly into a `Sweep`;
- `credo.ablate.plan`: the (variant, seed) runs, each recipe loaded and validated before anything starts,
  grouped by the SFT warm-up they share;
- `credo.ablate.scheduler`: `run_sweep`: runs N at once, resumes an interrupted sweep, writes sweep.json;
- `credo.ablate.results`: the raw results, one JSON line per finished run (schema in its docstring, and the one
  loader that also reads the older flat and arm/metrics lines);
- `credo.ablate.prereg`: pre-registration from git: the sweep file must be committed (or the run exploratory), and
  whether each named comparison was committed before its runs;
- `credo.ablate.report`: per-run reductions, statistics over seeds, comparisons, curves, from results records;
- `credo.ablate.tables`: those as markdown and CSV; `credo.ablate.outputs`: what a sweep writes;
- `credo.ablate.report_cli`: `credo report` and the tables of docs/reproductions.md it regenerates;
- `credo.ablate.stats`: Student-t intervals, Welch's and the paired t-test, Hedges' g, g_av (paired), Holm's adjustment.
"""

import importlib

_EXPORTS = {
    "RESULT_NEUTRAL": "credo.ablate.plan",
    "Run": "credo.ablate.plan",
    "config_hash": "credo.ablate.plan",
    "plan_runs": "credo.ablate.plan",
    "warmup_group": "credo.ablate.plan",
    "Compared": "credo.ablate.report",
    "Summary": "credo.ablate.report",
    "VariantResult": "credo.ablate.report",
    "curve_stats": "credo.ablate.report",
    "plot_curves": "credo.ablate.report",
    "reduce_curve": "credo.ablate.report",
    "reduce_metric": "credo.ablate.report",
    "summarize_records": "credo.ablate.report",
    "read_results": "credo.ablate.results",
    "upsert_results": "credo.ablate.results",
    "classify": "credo.ablate.scheduler",
    "finished_ok": "credo.ablate.scheduler",
    "run_sweep": "credo.ablate.scheduler",
    "write_sweep_json": "credo.ablate.scheduler",
    "DEFAULT_SEEDS": "credo.ablate.spec",
    "Comparison": "credo.ablate.spec",
    "Metric": "credo.ablate.spec",
    "Sweep": "credo.ablate.spec",
    "load_sweep": "credo.ablate.spec",
    "EffectSize": "credo.ablate.stats",
    "MeanCI": "credo.ablate.stats",
    "PairedDiff": "credo.ablate.stats",
    "WelchDiff": "credo.ablate.stats",
    "hedges_g": "credo.ablate.stats",
    "paired_g_av": "credo.ablate.stats",
    "holm": "credo.ablate.stats",
    "mean_ci": "credo.ablate.stats",
    "paired_diff": "credo.ablate.stats",
    "welch_diff": "credo.ablate.stats",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """The public names load their module on first use: `credo report`'s parser, built for every `credo` command,
    imports this package without scipy or the scheduler."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'credo.ablate' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
