"""The SFT warm-up cache key follows the model's contents and the data, not the model's path."""

import shutil

import pytest
import torch

from credo.config import TinyModelConfig, load_recipe
from credo.sft import sft_cache_key

QUICKSTART = "recipes/quickstart.yaml"
SMALL = dict(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64)


def save_tiny_qwen2(folder, num_layers: int) -> None:
    """A tiny Qwen2 and its tokenizer written to `folder` (overwriting what is there), like a user's model."""
    from transformers import AutoModelForCausalLM

    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    config = tiny_model_config(TinyModelConfig(num_layers=num_layers, **SMALL), len(tok), tok)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(QUICKSTART)


def test_model_rebuilt_at_the_same_path_gets_a_new_key(tmp_path, recipe):
    model = tmp_path / "model"
    save_tiny_qwen2(model, num_layers=2)
    two = sft_cache_key(recipe, str(model))
    assert sft_cache_key(recipe, str(model)) == two  # stable while the folder is unchanged
    save_tiny_qwen2(model, num_layers=3)
    assert sft_cache_key(recipe, str(model)) != two


def test_key_follows_contents_not_path(tmp_path, recipe):
    save_tiny_qwen2(tmp_path / "a", num_layers=1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    key = sft_cache_key(recipe, str(tmp_path / "a"))
    assert sft_cache_key(recipe, str(tmp_path / "b")) == key
    # a changed tokenizer file is a different model
    cfg = tmp_path / "b" / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace('"<eos>"', '"<pad>"', 1))
    assert sft_cache_key(recipe, str(tmp_path / "b")) != key
    # files that do not shape the model leave the key alone
    (tmp_path / "a" / "README.md").write_text("notes\n")
    assert sft_cache_key(recipe, str(tmp_path / "a")) == key


def test_key_follows_the_data_and_sft_settings(tmp_path, recipe):
    save_tiny_qwen2(tmp_path / "m", num_layers=1)
    base = sft_cache_key(recipe, str(tmp_path / "m"))
    for override in ("task.kwargs.max_operand=20", "task.seed=1", "sft.steps=10", "sft.seed=3"):
        assert sft_cache_key(load_recipe(QUICKSTART, [override]), str(tmp_path / "m")) != base, override
    # run.seed does not reach a warm-up whose sft.seed is fixed (quickstart fixes it)
    assert sft_cache_key(load_recipe(QUICKSTART, ["run.seed=5"]), str(tmp_path / "m")) == base


def test_tiny_path_keys_like_the_built_folder(recipe):
    """credo ablate keys runs by the recipe's 'tiny'; the trainer by the folder it resolves to: the same warm-up."""
    from credo.models import resolve_model_path

    folder = resolve_model_path("tiny", recipe.model.tiny)
    assert sft_cache_key(recipe, "tiny") == sft_cache_key(recipe, folder)
    bigger = load_recipe(QUICKSTART, ["model.tiny.num_layers=3"])
    assert sft_cache_key(bigger, "tiny") != sft_cache_key(recipe, "tiny")
