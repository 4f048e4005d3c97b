"""The attention-credit recipes: the thin CPU recipe, the 7-variant sweep, and the paper-scale GPU configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from credo import ablate, cli
from credo.config import load_recipe

REPO = Path(__file__).resolve().parents[2]


def test_sweep_has_the_seven_strategies_five_seeds_and_forty_steps():
    # (tests/ablate/test_sweep.py plans and validates every run of every sweep file; here one recipe per variant)
    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "attention_credit.yaml")
    assert sweep.baseline == "grpo" and sorted(sweep.seeds) == [0, 1, 2, 3, 4]
    strategies = set()
    for name, overrides in sweep.variants.items():
        recipe = load_recipe(sweep.base, [*sweep.overrides, *overrides])
        assert recipe.run.steps == 40, name
        probes = recipe.stages.probes
        strategies.add(recipe.stages.probe_kwargs["attention_credit"]["strategy"] if probes else None)
    assert strategies == {None, "random", "entropy", "local", "global", "coupled", "flow"}


def test_thin_recipe_is_the_quickstart_plus_the_probe():
    quick, credit = load_recipe(REPO / "recipes" / "quickstart.yaml"), load_recipe(REPO / "recipes" / "attention_credit.yaml")
    for section in ("model", "task", "sft", "rollout", "algo", "optim"):
        assert getattr(quick, section) == getattr(credit, section), section
    assert credit.stages.probes == ["attention_credit"]
    assert credit.stages.probe_kwargs["attention_credit"]["strategy"] == "coupled"


@pytest.mark.parametrize("name,strategy,tokens", [("attention_coupled_qwen3_4b", "coupled", 1024),
                                                  ("attention_flow_qwen3_4b", "flow", 8192)])
def test_gpu_configs_pass_credo_check(name, strategy, tokens, monkeypatch, capsys):
    path = REPO / "recipes" / "gpu" / f"{name}.yaml"
    # `credo check` in this process (a subprocess re-imports torch and transformers: minutes on a busy CPU)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["check", str(path), "--show"]) == 0
    out = capsys.readouterr().out
    assert f"name: {name}" in out and out.strip().splitlines()[-1] == f"credo check: OK ({path})"
    r = load_recipe(path)
    assert r.model.path == "Qwen/Qwen3-4B-Base" and r.rollout.max_new_tokens == tokens
    # the papers' recipe: batch 512, 16 gradient steps, lr 1e-6, no KL, no entropy loss
    assert r.rollout.prompts_per_step * r.rollout.group_size == 512 and r.algo.mini_batches == 16
    assert (r.optim.lr, r.algo.kl_coef, r.algo.entropy_coef, r.algo.advantage) == (1e-6, 0.0, 0.0, "grpo")
    kwargs = r.stages.probe_kwargs["attention_credit"]
    assert (kwargs["strategy"], kwargs["q"], kwargs["gamma_amp"]) == (strategy, 0.4, 1.5)
