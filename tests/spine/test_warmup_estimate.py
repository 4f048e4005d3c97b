"""Issue 57 A.7 (check part): `credo check` states each warm-up's estimated time and whether it is cached. The
cached state is the run's own (the warm-up's cache key); the cost model's weight term is the model's real parameter
count; a warm-up that ran records its time, which the next estimate uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.config import load_recipe
from credo.warmup_estimate import (DEFAULT_FLOPS_PER_S, DEFAULT_STEP_S, cost_model, flops_per_step, human, model_shape,
                                   seconds, warmup_notes)
from tests.e2e.common import tiny_overrides


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "cache"))
    return load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"sft.steps": 3}))


def test_the_weight_term_is_the_models_parameter_count(recipe):
    from credo.models import load_causal_lm, resolve_model_path

    base = resolve_model_path(recipe.model.path, recipe.model.tiny)
    model = load_causal_lm(base)
    body = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and p.dim() == 2)
    # tokens = 1: the attention term is 6 x layers x h; the rest is 6 flops per weight (head included)
    shape = model_shape(recipe, base)
    attention = 6 * shape["layers"] * shape["h"]
    assert flops_per_step(shape, 1, 1) - attention == pytest.approx(6 * body, rel=0.01)
    assert flops_per_step(shape, 4, 10) == 4 * 10 * (6 * body + 6 * shape["layers"] * 10 * shape["h"])


def test_check_says_not_cached_then_cached_after_the_warm_up(recipe):
    from credo.models import resolve_model_path
    from credo.plan import resolve_plan
    from credo.sft import run_sft
    from credo.train.build import run_task

    task = run_task(resolve_plan(recipe))
    before = warmup_notes(recipe, task)
    assert len(before) == 1 and before[0].startswith("warm-up 'sft' (3 steps of 16): not cached, about ")
    assert "the defaults of a 2-core CPU host" in before[0]
    folder, _ = run_sft(recipe, resolve_model_path(recipe.model.path, recipe.model.tiny), task, log=lambda m: None)
    record = json.loads((Path(folder) / "sft.json").read_text())
    assert record["seconds"] > 0 and record["flops"] > 0
    after = warmup_notes(recipe, task)
    assert after == [f"warm-up 'sft' (3 steps): cached ({folder}), reused at once"]
    recipe.sft.steps = 4  # another warm-up: estimated from the one this machine just ran
    assert "measured on 1 warm-up(s) cached here" in warmup_notes(recipe, task)[0]


def test_times_read_to_one_significant_figure():
    assert [human(s) for s in (0.2, 42, 426, 960, 5400)] == ["1 s", "40 s", "7 min", "20 min", "1.5 h"]


def _cache_with(tmp_path, warmups) -> Path:
    for i, (steps, secs, flops) in enumerate(warmups):
        d = tmp_path / "sft" / f"k{i}"
        d.mkdir(parents=True)
        (d / "sft.json").write_text(json.dumps({"steps": steps, "seconds": secs, "flops": flops}))
    return tmp_path


def test_the_cost_model_fits_a_fixed_cost_and_a_throughput_through_timed_warm_ups(tmp_path):
    # five warm-ups on the line seconds/step = 0.2 + (flops/step) / 5e10, one of them timed under a 3x load: the fit
    # recovers the line (a least-squares line would be pulled by the slow one), and a plan is costed by it
    c, rate = 0.2, 5e10
    sizes = [(100, 1e9), (200, 4e9), (50, 1e10), (400, 2e10), (300, 4e10)]
    warmups = [(n, n * (c + f / rate) * (3 if i == 2 else 1), n * f) for i, (n, f) in enumerate(sizes)]
    got_c, got_rate, source = cost_model(_cache_with(tmp_path, warmups))
    assert got_c == pytest.approx(c, rel=1e-9) and got_rate == pytest.approx(rate, rel=1e-9)
    assert source == "fitted to 5 warm-ups timed here"
    assert seconds({"steps": 10, "flops": 10 * 3e10}, (got_c, got_rate, source)) == pytest.approx(10 * (0.2 + 0.6))


def test_with_few_timed_warm_ups_the_fixed_cost_is_the_default_and_never_most_of_a_step(tmp_path):
    assert cost_model(tmp_path / "empty") == (DEFAULT_STEP_S, DEFAULT_FLOPS_PER_S, "the defaults of a 2-core CPU host")
    # one warm-up of 0.5 s a step: the default fixed cost, the rest of the step is the throughput's
    c, rate, source = cost_model(_cache_with(tmp_path / "a", [(100, 50.0, 100 * 4e10)]))
    assert (c, source) == (DEFAULT_STEP_S, "measured on 1 warm-up(s) cached here")
    assert rate == pytest.approx(4e10 / (0.5 - DEFAULT_STEP_S))
    # a GPU-fast warm-up (0.01 s a step): the fixed cost is at most half of it, so the throughput stays positive
    c, rate, _ = cost_model(_cache_with(tmp_path / "b", [(100, 1.0, 100 * 4e10), (100, 1.0, 100 * 4e10)]))
    assert c == pytest.approx(0.005) and rate == pytest.approx(4e10 / 0.005)


def test_the_defaults_are_the_line_through_the_idle_warm_ups_they_cite():
    # (steps, seconds, flops) of the five warm-ups DEFAULT_STEP_S's docstring names; the defaults are their fit rounded
    idle = [(600, 68.3, 2.09e12), (150, 18.9, 2.16e12), (150, 59.5, 6.47e12), (400, 81.4, 5.24e12),
            (400, 131.2, 8.58e12)]
    for steps, secs, flops in idle:
        estimate = seconds({"steps": steps, "flops": flops}, (DEFAULT_STEP_S, DEFAULT_FLOPS_PER_S, ""))
        assert 0.5 < secs / estimate < 1.25
