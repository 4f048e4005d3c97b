"""End to end through the CLI: `credo run` of the quickstart with distillation on (both forms), a warm-up teacher
trained and cached on the way, the distill/* metrics in every row and the exported final/ model."""

from __future__ import annotations

import math

import pytest

from tests.e2e.common import read_rows, run_cli, tiny_overrides


@pytest.mark.heavy
def test_a_tiny_distillation_run_trains_logs_and_exports(tmp_path):
    out = tmp_path / "run"
    args = ["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
        "distill.enabled": True, "distill.teacher": "warmup", "distill.teacher_sft": "{noisy_frac: 0.0, steps: 8}",
        "distill.weight": 0.7, "distill.loss_coef": 0.1})]
    p = run_cli(args, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [r for r in read_rows(out) if "train/loss" in r]
    assert len(rows) == 3
    for r in rows:
        for key in ("distill/reverse_kl", "distill/teacher_logprob", "distill/student_logprob", "train/distill_kl",
                    "perf/distill_teacher_s"):
            assert math.isfinite(r[key]), key
        assert r["distill/teacher_logprob"] < 0 and r["train/distill_kl"] >= 0
    assert (out / "final" / "config.json").is_file()
