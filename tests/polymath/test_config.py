"""The polymath: section and the one sample at `credo check`: every bad sample (no verifier, a verifier that rejects
its own answer, a missing meta key, an index or discipline that does not exist) is a ConfigError naming the key,
before any warm-up; the recipe, the sweep and the GPU config load and pass `credo check`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from credo.config import ConfigError, load_recipe
from credo.train.build import check_run
from tests.e2e.common import REPO

RECIPE = REPO / "recipes" / "polymath.yaml"
SMALL = ["task.train_size=300", "task.eval_size=8",
         "task.kwargs={disciplines: {add: {task: add_scratch, kwargs: {digits: 2}}, sort: {task: sort, kwargs: "
         "{length: 4}}, combo: {combine: [add, sort]}}}"]


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def check(*overrides: str) -> list[str]:
    return list(check_run(load_recipe(RECIPE, [*SMALL, *overrides])).notes)


@pytest.mark.parametrize("overrides, message", [
    (["polymath.sample={prompt: '47+86=', answer: '7+6+0=13,4+8+1=13>133'}"],
     "config key 'polymath.sample.verifier' is not set: the one training sample has no verifier"),
    (["polymath.sample={prompt: '47+86=', verifier: add}"], "config key 'polymath.sample.answer' is not set"),
    (["polymath.sample={prompt: '47+86=', answer: '1', verifier: add, index: 3}"],
     "config key 'polymath.sample.prompt' is set with discipline / index / select"),
    (["polymath.sample={answer: '1', verifier: add}"], "whose prompt is missing"),
    (["polymath.sample={discipline: add}"], "config key 'polymath.sample.index' is not set"),
    (["polymath.sample={discipline: add, index: -1}"], "'polymath.sample.index' = -1 is out of range"),
    (["polymath.sample={select: skills, index: 2}"], "'polymath.sample.index' = 2 is set with select: skills"),
    (["polymath.sample={select: judge}"], "config key 'polymath.judge_path' is not set"),
    (["polymath.sample={select: best}"], "'polymath.sample.select' = 'best' is out of range"),
    (["polymath.sample={indx: 3}"], "unknown config key"),
    (["stages.rollout=default"], "config key 'polymath.sample' is set but stages.rollout is 'default'"),
    (["polymath.sample=null"], "config key 'stages.rollout' = 'one_sample' needs the sample"),
])
def test_bad_samples_are_refused_at_load_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_recipe(RECIPE, [*SMALL, *overrides])
    assert message in str(e.value)


@pytest.mark.parametrize("overrides, message", [
    (["polymath.sample={prompt: '47+86=', answer: '7+6+0=13,4+8+1=13>133', verifier: mul}"],
     "config key 'polymath.sample.verifier' = 'mul' is not a discipline of the task, so the sample has no verifier"),
    (["polymath.sample={prompt: '47+86=', answer: '7+6+0=13,4+8+1=13>133', verifier: add}"],
     "config key 'polymath.sample.verifier': the verifier of 'add' reads meta key 'result' of the sample"),
    (["polymath.sample={prompt: '47+86=', answer: '7+6+0=13,4+8+1=13>134', verifier: add, meta: {result: 133}}"],
     "the verifier of 'add' scores the sample's own reference answer 0.0 (expected 1.0)"),
    (["polymath.sample={discipline: add, index: 99999}"],
     "config key 'polymath.sample.index' = 99999 is out of range: discipline 'add' has"),
    (["polymath.sample={discipline: physics, index: 0}"], "config key 'polymath.sample.discipline' = 'physics'"),
    (["polymath.sample={index: 0}"], "config key 'polymath.sample.discipline' is not set: the task has the disciplines"),
    (["polymath.eval_disciplines=[add, physics]"], "config key 'polymath.eval_disciplines[1]' = 'physics'"),
])
def test_samples_that_cannot_be_verified_fail_credo_check_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        check(*overrides)
    assert message in str(e.value)


def test_good_samples_pass_and_the_note_names_the_sample():
    inline = check("polymath.sample={prompt: '47+86=', answer: '7+6+0=13,4+8+1=13>133', verifier: add, "
                   "meta: {result: 133}}")
    assert any("inline sample verified by 'add'" in n for n in inline)
    best = check("polymath.sample={select: skills, candidates: 16}")
    assert any("best skill score" in n and "add, sort" in n for n in best)
    combo = check("polymath.sample={discipline: combo, select: skills, candidates: 16}")
    assert any(n.startswith("polymath.sample: combo[") and "|" in n for n in combo)
    full = check("stages.rollout=default", "polymath.sample=null")  # the full data set: no sample
    assert not any("polymath.sample" in n for n in full)


def test_the_cli_prints_the_missing_verifier_and_exits_2():
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", str(RECIPE), *SMALL,
                        "polymath.sample={prompt: 'sort:dcba=', answer: abcd}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "credo: config error: config key 'polymath.sample.verifier' is not set")


def test_recipe_sweep_and_gpu_config_load():
    r = load_recipe(RECIPE)
    assert r.task.name == "polymath" and r.stages.rollout == "one_sample" and r.polymath.sample.select == "skills"
    from credo import ablate

    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "polymath.yaml")
    assert len(sweep.seeds) >= 5 and sweep.baseline == "full_data"
    rollouts = {}
    for name, over in sweep.variants.items():  # every variant is a valid recipe
        v = load_recipe(sweep.base, [*sweep.overrides, *over])
        rollouts[name] = (v.stages.rollout, v.polymath.sample)
    assert rollouts["full_data"] == ("default", None)
    assert all(src == "one_sample" and s is not None for n, (src, s) in rollouts.items() if n != "full_data")


def test_gpu_config_passes_credo_check():
    path = REPO / "recipes" / "gpu" / "polymath_qwen2_5_math_1_5b.yaml"
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(path)
    assert r.task.name == "polymath" and r.stages.rollout == "one_sample" and r.rollout.prompts_per_step == 128
    assert r.rollout.backend == "vllm" and r.model.path.startswith("Qwen/")
