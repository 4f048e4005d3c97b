"""The distill family's section at `credo check`: the recipe and the GPU config pass; a teacher with another
tokenizer, a placement without what it needs (more in tests/distill/test_placement.py), a token mapping and the
settings that cannot distil are refused, naming the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from credo.config import load_recipe
from credo.errors import ConfigError
from credo.train.build import check_run

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "distill.yaml"


def check(*overrides, recipe=RECIPE):
    return list(check_run(load_recipe(str(recipe), list(overrides))).notes)


GPU = REPO / "recipes" / "gpu" / "distill_qwen3.yaml"


def test_the_recipe_passes_credo_check_and_the_gpu_config_loads():
    r = load_recipe(str(RECIPE))
    assert r.distill.enabled and r.distill.teacher == "warmup" and r.distill.teacher_sft == {"noisy_frac": 0.0}
    check()
    g = load_recipe(str(GPU))  # strict loading and the family's own checks (check_distill)
    assert (g.model.path, g.distill.teacher, g.distill.placement) == ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "trainer")


@pytest.mark.heavy
def test_the_gpu_config_passes_credo_check(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notes = check(recipe=GPU)
    assert any("distill.teacher 'Qwen/Qwen3-8B'" in n for n in notes)  # offline: noted, not silently passed


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """Two model folders of the tiny model: one with its own tokenizer, one whose tokenizer has one more token."""
    from credo.config import TinyModelConfig
    from credo.models import load_tokenizer, resolve_model_path

    r = load_recipe(str(RECIPE))
    tiny = Path(resolve_model_path("tiny", r.model.tiny))
    root = tmp_path_factory.mktemp("teachers")
    same, other = root / "same", root / "other"
    shutil.copytree(tiny, same)
    shutil.copytree(tiny, other)
    tok = load_tokenizer(str(other))
    tok.add_tokens(["<think>"])
    tok.save_pretrained(other)
    assert TinyModelConfig  # the tiny model's vocabulary is padded, so the added token still fits its embedding
    return same, other


def test_a_teacher_folder_with_the_students_tokenizer_passes(teachers):
    same, _ = teachers
    check(f"distill.teacher={same}", "distill.teacher_sft={}")


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_key_and_the_file(teachers):
    _, other = teachers
    with pytest.raises(ConfigError, match=rf"config key 'distill.teacher' = '{other}': its tokenizer "
                                          rf"\({other}/tokenizer.json\) is not the student's.*'<think>'"):
        check(f"distill.teacher={other}", "distill.teacher_sft={}")
    with pytest.raises(ConfigError, match="config key 'distill.token_mapping' = 'map.json': cross-tokenizer"):
        check(f"distill.teacher={other}", "distill.teacher_sft={}", "distill.token_mapping=map.json")
    check(f"distill.teacher={other}", "distill.teacher_sft={}", "distill.enabled=false")  # off: not looked at


@pytest.mark.parametrize("overrides, message", [
    (["distill.placement=ray"], "config keys 'distill.placement' and 'cluster.engine' cannot be used together"),
    (["distill.placement=gpu"],
     "config key 'distill.placement' = 'gpu' is out of range: expected trainer, worker or ray"),
    (["distill.teacher="], "config key 'distill.teacher' is empty"),
    (["distill.teacher=/nonexistent/teacher", "distill.teacher_sft={}"], "distill.teacher '/nonexistent/teacher' does "
                                                                          "not exist"),
    (["distill.teacher_sft={noisy_frak: 0.0}"], "config key 'distill.teacher_sft.noisy_frak' is not a key of the sft "
                                                "section; did you mean 'noisy_frac'"),
    (["distill.teacher_sft={noisy_frac: 2.0}"], "config key 'distill.teacher_sft.noisy_frac' = 2.0 is out of range"),
    (["distill.teacher_sft={steps: many}"], "config key 'distill.teacher_sft.steps' = 'many' is out of range"),
    (["distill.weight=1.5"], "config key 'distill.weight' = 1.5 is out of range"),
    (["rollout.temperature=0.7"], "config keys 'distill.enabled' and 'rollout.temperature' cannot be used together"),
    (["rollout.top_k=5"], "config keys 'distill.enabled' and 'rollout.top_k' cannot be used together"),
    (["rollout.top_p=0.9"], "config keys 'distill.enabled' and 'rollout.top_p' cannot be used together"),
    (["rollout.min_p=0.1"], "config keys 'distill.enabled' and 'rollout.min_p' cannot be used together"),
    (["stages.advantage=turn_credit"], "config key 'stages.advantage' = 'turn_credit' cannot be used with distill"),
    (["critic.num_critics=1", "algo.advantage=gae"], "families 'critic' and 'distill' are both active"),
])
def test_refusals_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check(*overrides)


def test_credo_check_estimates_the_warm_up_teacher_under_its_own_key():
    from credo.train.build import run_task
    from credo.warmup_estimate import warmup_notes

    plan = check_run(load_recipe(str(RECIPE), ["distill.teacher_sft={noisy_frac: 0.0, steps: 7}"]))
    notes = [n for n in warmup_notes(plan.recipe, run_task(plan), plan.active) if "distill teacher" in n]
    assert len(notes) == 1 and notes[0].startswith("warm-up 'distill teacher' (7 steps")
    assert check_run(load_recipe(str(RECIPE), ["distill.enabled=false"])).active == ()  # off: no teacher at all
