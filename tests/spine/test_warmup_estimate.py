"""Issue 57 A.7 (check part): `credo check` states each warm-up's estimated time and whether it is cached. The
cached state is the run's own (the warm-up's cache key); the cost model's weight term is the model's real parameter
count; a warm-up that ran records its time, which the next estimate uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.config import load_recipe
from credo.warmup_estimate import flops_per_step, human, model_shape, warmup_notes
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
    assert "the default throughput of a 2-core CPU host" in before[0]
    folder, _ = run_sft(recipe, resolve_model_path(recipe.model.path, recipe.model.tiny), task, log=lambda m: None)
    record = json.loads((Path(folder) / "sft.json").read_text())
    assert record["seconds"] > 0 and record["flops"] > 0
    after = warmup_notes(recipe, task)
    assert after == [f"warm-up 'sft' (3 steps): cached ({folder}), reused at once"]
    recipe.sft.steps = 4  # another warm-up: estimated from the one this machine just ran
    assert "measured on 1 warm-up(s) cached here" in warmup_notes(recipe, task)[0]


def test_times_read_to_one_significant_figure():
    assert [human(s) for s in (0.2, 42, 426, 960, 5400)] == ["1 s", "40 s", "7 min", "20 min", "1.5 h"]
