"""benchmarks/staleness_lr.py: the collapse rule, eta_max, and the provenance each result line carries (the commit
and date the run trained at, not the ones analyze ran at)."""

import importlib.util
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("staleness_lr_bench", REPO / "benchmarks" / "staleness_lr.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_collapse_is_the_first_eval_below_half_the_best_so_far():
    assert bench.collapse_step([(0, 0.4), (2, 0.5), (4, 0.26), (6, 0.1)], None) == 6  # 0.26 >= 0.25 at step 4: not yet
    assert bench.collapse_step([(0, 0.4), (2, 0.5), (4, 0.24)], None) == 4
    assert bench.collapse_step([(0, 0.4), (2, 0.45)], None) is None
    assert bench.collapse_step([(0, 0.4), (2, 0.45)], 7) == 7  # stopped by non-finite values


def test_eta_max_is_the_largest_rate_below_every_collapse():
    assert bench.eta_max({1e-4: False, 2e-4: False, 4e-4: True, 8e-4: True}) == (2e-4, False)
    assert bench.eta_max({1e-4: False, 2e-4: False}) == (2e-4, True)  # none collapsed: censored
    assert bench.eta_max({1e-4: True, 2e-4: True})[0] is None


def test_provenance_is_the_runs_not_the_analysis(tmp_path):
    run = tmp_path / "seed0"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    os.utime(run / "metrics.jsonl", (1764892800, 1764892800))  # 2025-12-05 00:00 UTC
    assert bench.provenance(run, "abc1234") == {"commit": "abc1234", "date": "2025-12-05"}
    assert "run commit not recorded" in bench.provenance(run, None)["commit"]
    (run / "started.json").write_text(json.dumps({"commit": "def5678", "date": "2026-01-02"}))
    assert bench.provenance(run, "abc1234") == {"commit": "def5678", "date": "2026-01-02"}
