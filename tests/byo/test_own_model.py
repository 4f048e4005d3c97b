"""Own model: no warm-up by default, pad = eos with one warning, a relative folder is local (never the hub)."""

from credo.plan import resolve_plan
import logging
import os

import pytest

from credo.config import ConfigError, TinyModelConfig, load_recipe
from credo.models import load_tokenizer, resolve_model_path
from tests.byo.common import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("own") / "my-model")


def test_warm_up_is_off_for_an_own_model_unless_turned_on(model_dir):
    assert load_recipe(None, ["run.name=x"]).sft.enabled is True  # the built-in tiny model keeps its warm-up
    assert load_recipe(None, ["run.name=x", f"model.path={model_dir}"]).sft.enabled is False
    assert load_recipe(None, ["run.name=x", f"model.path={model_dir}", "sft.enabled=true"]).sft.enabled is True
    assert load_recipe("recipes/quickstart.yaml", []).sft.enabled is True


def test_missing_pad_token_becomes_eos_with_one_warning(model_dir, caplog):
    import credo.models

    credo.models._PAD_WARNED.discard(str(model_dir))
    with caplog.at_level(logging.WARNING, logger="credo"):
        first = load_tokenizer(str(model_dir))
        second = load_tokenizer(str(model_dir))
    assert first.pad_token == first.eos_token == "<|im_end|>" and second.pad_token_id == second.eos_token_id
    assert sum("has no pad_token" in m for m in caplog.messages) == 1


def test_tokenizer_without_eos_is_still_an_error(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from tests.byo.common import build_bpe_tokenizer

    tok = build_bpe_tokenizer()
    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    bare.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="has no eos_token"):
        load_tokenizer(str(tmp_path))


def test_relative_existing_folder_is_local_even_when_it_looks_like_a_hub_id(model_dir, monkeypatch):
    """'org/name' that exists under the working directory loads from disk with the hub unreachable."""
    monkeypatch.chdir(model_dir.parent.parent)
    rel = os.path.join(model_dir.parent.name, model_dir.name)  # 'ownN/my-model': the shape of a hub id
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model_path(rel, TinyModelConfig())
    assert os.path.isabs(path) and os.path.samefile(path, model_dir)
    from credo.models import load_causal_lm

    assert load_causal_lm(path).config.model_type == "qwen2"
    with pytest.raises(ConfigError, match="exists but has no config.json"):
        resolve_model_path(model_dir.parent.name, TinyModelConfig())


def test_file_task_without_reward_functions_is_an_error(tmp_path, model_dir):
    from credo.tasks import make_task
    from credo.train.setup import reward_function
    from tests.byo.common import qa_rows, write_jsonl

    data = write_jsonl(tmp_path / "d.jsonl", qa_rows(6, seed=0))
    r = load_recipe(None, ["run.name=x", "task.name=file", f"task.kwargs={{train: {data}}}", "task.eval_size=2"])
    with pytest.raises(ConfigError, match="task 'file' has no verifier: expected reward.functions"):
        reward_function(r, make_task(r.task), resolve_plan(r).reward_functions)
