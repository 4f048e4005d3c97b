"""`credo ablate SWEEP.yaml`: run recipe variants over seeds as separate processes and tabulate them.

- `credo.ablate.spec`: the sweep file (format in its docstring), read strictly into a `Sweep`;
- `credo.ablate.plan`: the (variant, seed) runs, each recipe loaded and validated before anything starts,
  grouped by the SFT warm-up they share;
- `credo.ablate.scheduler`: `run_sweep`: runs N at once, resumes an interrupted sweep, writes sweep.json;
- `credo.ablate.report`: per-run metric reduction, statistics over seeds, table.md, table.csv, curves.png;
- `credo.ablate.stats`: Student-t intervals of a mean and Welch's t-test against the baseline variant.
"""

from credo.ablate.plan import RESULT_NEUTRAL, Run, config_hash, plan_runs, warmup_group
from credo.ablate.report import VariantResult, curve_stats, plot_sweep_curves, reduce_metric, summarize, write_tables
from credo.ablate.scheduler import classify, finished_ok, run_sweep, write_sweep_json
from credo.ablate.spec import DEFAULT_SEEDS, Metric, Sweep, load_sweep
from credo.ablate.stats import MeanCI, WelchDiff, mean_ci, welch_diff

__all__ = ["DEFAULT_SEEDS", "MeanCI", "Metric", "RESULT_NEUTRAL", "Run", "Sweep", "VariantResult", "WelchDiff", "classify",
           "config_hash", "curve_stats", "finished_ok", "load_sweep", "mean_ci", "plan_runs", "plot_sweep_curves", "reduce_metric",
           "run_sweep", "summarize", "welch_diff", "warmup_group", "write_sweep_json", "write_tables"]
