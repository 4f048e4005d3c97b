"""The reproduction testbed (issue #12): its recipes and GPU configs pass `credo check`, its sweeps plan valid
runs, and the selection's weak variants are the weak estimators and aggregations they are named for."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from credo import ablate
from credo.config import load_recipe

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "recipes" / "testbed"


def _sweeps():
    return sorted(p for p in TESTBED.rglob("*.yaml") if "variants" in yaml.safe_load(p.read_text()))


def test_the_gpu_config_passes_credo_check():
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/testbed/gpu/testbed_qwen3_4b.yaml"],
                       cwd=REPO, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "model.path 'Qwen/Qwen3-4B-Base': not checked (offline)" in p.stdout


@pytest.mark.parametrize("path", _sweeps(), ids=lambda p: str(p.relative_to(TESTBED)))
def test_every_testbed_sweep_plans_valid_runs(path):
    sweep = ablate.load_sweep(path)
    assert len(sweep.seeds) >= 5 and sweep.baseline in sweep.variants
    sweep.seeds = sweep.seeds[:1]  # every variant's recipe validates; the other seeds differ only in run.seed
    runs = ablate.plan_runs(sweep, threads=1)
    assert len(runs) == len(sweep.variants)
    if "gpu" in path.parts:
        return
    # a warm-up study (warmup_spread_sort16) varies the warm-up: each variant is its own warm-up
    if any(o.startswith("sft.") for ov in sweep.variants.values() for o in ov):
        assert len({r.warmup_group for r in runs}) == len(runs), path
    else:  # the CPU sweeps: the variants of a seed share its warm-up (paired by seed)
        assert len({r.warmup_group for r in runs}) == 1


@pytest.mark.parametrize("path", sorted((TESTBED / "selection").glob("*.yaml")), ids=lambda p: p.stem)
def test_selection_sweeps_pit_grpo_against_the_weak_variants(path):
    sweep = ablate.load_sweep(path)
    sweep.seeds = sweep.seeds[:1]  # the variants' recipes; the other seeds differ only in run.seed
    runs = {r.variant: r.recipe for r in ablate.plan_runs(sweep, threads=1)}
    assert (runs["grpo"].algo.advantage, runs["grpo"].algo.agg_mode) == ("grpo", "token-mean")
    assert runs["reinforce_no_baseline"].algo.advantage == "reinforce"
    assert runs["grpo_no_std"].algo.advantage_kwargs == {"norm_std": False}
    assert runs["seq_sum"].algo.agg_mode == "seq-mean-token-sum"
    # the variants differ from grpo in nothing else
    for name, r in runs.items():
        assert (r.optim, r.rollout, r.sft, r.task) == (runs["grpo"].optim, runs["grpo"].rollout, runs["grpo"].sft,
                                                        runs["grpo"].task), name


def test_gpu_configs_are_at_paper_scale():
    r = load_recipe(TESTBED / "gpu" / "testbed_qwen3_4b.yaml")
    assert r.model.path == "Qwen/Qwen3-4B-Base" and r.model.dtype == "bfloat16" and r.rollout.backend == "vllm"
    assert (r.rollout.prompts_per_step, r.rollout.group_size, r.optim.lr) == (128, 8, 1e-6)
    assert r.rollout.max_new_tokens >= 4096 and not r.sft.enabled


def test_every_sweep_in_recipes_writes_its_results_under_docs():
    """Issue 33: the per-run results behind every table are committed, one file per sweep, docs/results/<name>.jsonl."""
    sweeps = [p for p in (REPO / "recipes").rglob("*.yaml") if {"variants", "grid"} & set(yaml.safe_load(p.read_text()))]
    assert len(sweeps) >= 20
    for path in sweeps:
        sweep = ablate.load_sweep(path)
        assert sweep.results == Path("docs") / "results" / f"{sweep.name}.jsonl", path
