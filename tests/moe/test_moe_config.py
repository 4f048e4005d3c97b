"""The tiny Qwen3-MoE config, and algo.router_replay refused at `credo check` (plan + preflight), naming the keys,
wherever the routing would not be recorded or replayed (docs/moe.md)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from credo.config import ConfigError, TinyModelConfig, load_recipe
from credo.plan import resolve_plan
from credo.preflight import check_router_replay

MOE = "recipes/moe.yaml"


def recipe(path: str, *overrides: str):
    return load_recipe(path, list(overrides))


def test_the_recipe_loads_with_replay_on_and_off_by_default():
    r = recipe(MOE)
    assert r.algo.router_replay and r.model.tiny.arch == "qwen3_moe" and r.rollout.backend == "hf"
    assert recipe("recipes/quickstart.yaml").algo.router_replay is False
    resolve_plan(r)
    assert check_router_replay(r) == []


def test_the_tiny_qwen3_moe_config():
    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    cfg = tiny_model_config(recipe(MOE).model.tiny, len(tok), tok)
    assert type(cfg).__name__ == "Qwen3MoeConfig"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (8, 2, 96, True)
    assert cfg.decoder_sparse_step == 1 and cfg.mlp_only_layers == [] and cfg.num_hidden_layers == 2
    with pytest.raises(ConfigError, match="model.tiny.num_experts_per_tok"):
        tiny_model_config(TinyModelConfig(arch="qwen3_moe", num_experts=2, num_experts_per_tok=3), len(tok), tok)


def test_the_expert_fields_do_not_rename_a_dense_models_cache_folder():
    """The quickstart's tiny model keeps its folder (and so its cached warm-up) with the MoE fields added."""
    from credo.models import tiny_model_dir

    quick = recipe("recipes/quickstart.yaml").model.tiny
    assert tiny_model_dir(quick).name == "tiny-qwen2-66d68fcf594d"  # its name before the MoE fields existed
    assert tiny_model_dir(replace(quick, num_experts=16)) == tiny_model_dir(quick)
    moe = recipe(MOE).model.tiny
    assert tiny_model_dir(replace(moe, num_experts=16)) != tiny_model_dir(moe)


@pytest.mark.parametrize("overrides, other", [
    (["rollout.backend=vllm"], "rollout.backend"),
    (["cluster.engine=ray"], "cluster.engine"),
    (["stages.schedule=tail_batching"], "stages.schedule"),
    (["stages.schedule=overlap"], "stages.schedule"),
    (["model.gradient_checkpointing=true"], "model.gradient_checkpointing"),
])
def test_router_replay_is_refused_where_routing_is_not_recorded_or_replayed(overrides, other):
    with pytest.raises(ConfigError, match=rf"algo.router_replay.*{other}"):
        resolve_plan(recipe(MOE, *overrides))
    resolve_plan(recipe(MOE, "algo.router_replay=false", *overrides))  # without replay each of them plans


def test_router_replay_on_a_dense_model_is_refused_naming_both_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"'algo.router_replay' = true and 'model.tiny.arch' = 'qwen2'"):
        check_router_replay(recipe("recipes/quickstart.yaml", "algo.router_replay=true"))
    folder = tmp_path / "dense"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ConfigError, match=r"'algo.router_replay' = true and 'model.path'.*'qwen2'"):
        check_router_replay(recipe(MOE, f"model.path={folder}"))
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    assert check_router_replay(recipe(MOE, f"model.path={folder}")) == []
    note, = check_router_replay(recipe(MOE, "model.path=Qwen/Qwen3-30B-A3B"))
    assert "not checked" in note


def test_credo_check_refuses_router_replay_on_the_quickstart():
    """`credo check`'s own path (`credo.api.check`: preflight, then the task): the error names the key."""
    import credo

    with pytest.raises(ConfigError, match="algo.router_replay"):
        credo.check("recipes/quickstart.yaml", ["algo.router_replay=true"])


GPU = "recipes/gpu/router_replay_qwen3_30b_a3b.yaml"


def test_the_paper_scale_config_plans_with_replay_on():
    r = recipe(GPU)
    assert (r.model.path, r.algo.router_replay, r.rollout.backend, r.engine.zero_stage) == \
        ("Qwen/Qwen3-30B-A3B", True, "hf", 3)
    plan = resolve_plan(r)
    assert any(q.capability == "routing_capture" for q in plan.requirements)
    assert "not checked" in check_router_replay(r)[0]  # a hub id: checked when the model loads


@pytest.mark.heavy
@pytest.mark.parametrize("path", [GPU, MOE])
def test_the_recipes_pass_credo_check(path):
    """The CLI itself (a process of its own, offline: the hub id is noted, not downloaded)."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", path], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    assert "credo check: OK" in p.stdout + p.stderr
