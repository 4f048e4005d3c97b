"""Whole runs of recipes/distill.yaml (shrunk: short warm-ups, 3 steps, 8 prompts x 4 samples, row chunks of 8) with
the teacher at each placement, through `credo run`: every line of metrics.jsonl is the trainer placement's, key for
key and bit for bit, apart from perf/* (timings) and, on Ray, cluster/* (the pool's busy fractions and the teacher
role's own cluster/teacher_* keys). `worker` is compared with `trainer` on the local engine; `ray` with `trainer` on
a Ray run (cluster.engine: ray moves rollout onto Ray workers too, which draw other tokens than the local backend)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.common import read_rows, run_cli

SHRUNK = {
    "run.steps": 3, "run.eval_every": 3, "run.eval_samples": 1, "run.save_every": 0, "run.plot": False,
    "run.progress": False, "run.threads": 1, "run.seed": 0, "task.eval_size": 16, "sft.steps": 20,
    "distill.teacher_sft": "{noisy_frac: 0.0, steps: 30}", "rollout.prompts_per_step": 8, "rollout.group_size": 4,
    "algo.micro_batch_size": 8,
}
RAY = {"cluster.engine": "ray", "cluster.num_cpus": 4, "cluster.reward.workers": 1, "cluster.teacher.workers": 2}


def run(out, **extra) -> list[dict]:
    o = {**SHRUNK, "run.output_dir": str(out), **extra}
    p = run_cli(["run", "recipes/distill.yaml", *(f"{k}={v}" for k, v in o.items())], timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    return read_rows(out)


def same_but(a: list[dict], b: list[dict], ignored: tuple[str, ...]) -> None:
    assert len(a) == len(b) and sum("distill/teacher_logprob" in r for r in a) == 3
    for ra, rb in zip(a, b):
        keep = lambda r: {k: v for k, v in r.items() if not k.startswith(ignored)}  # noqa: E731
        assert json.dumps(keep(ra), sort_keys=True) == json.dumps(keep(rb), sort_keys=True)


@pytest.mark.heavy
def test_worker_placement_metrics_are_the_trainer_placements(tmp_path):
    trainer = run(tmp_path / "trainer")
    worker = run(tmp_path / "worker", **{"distill.placement": "worker"})
    same_but(trainer, worker, ("perf/",))


@pytest.mark.heavy
def test_ray_placement_metrics_are_the_trainer_placements_on_a_ray_run(tmp_path):
    trainer = run(tmp_path / "trainer", **RAY)
    ray = run(tmp_path / "ray", **RAY, **{"distill.placement": "ray"})
    same_but(trainer, ray, ("perf/", "cluster/"))
    steps = [(a, b) for a, b in zip(trainer, ray) if "train/loss" in a]  # (the step-0 evaluation logs no cluster/*)
    assert len(steps) == 3
    for a, b in steps:  # the Ray run logs what the trainer-placement one does, and the teacher role's
        extra = {k for k in b if k.startswith("cluster/")} - {k for k in a if k.startswith("cluster/")}
        assert extra and all(k.startswith("cluster/teacher_") for k in extra), extra
        assert b["cluster/teacher_workers"] == 2 and b["cluster/teacher_restarts"] == 0
