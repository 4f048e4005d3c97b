"""Bad inputs at the edges: each error names the thing at fault and says what was expected.

Recipe keys, types and ranges are tested in tests/spine/test_config.py (unknown key with a suggestion,
wrong type, out of range, missing file); they are not repeated here. The validating functions are
called directly where that is where the error comes from; a Trainer is built in-process where the check
lives in the trainer; one CLI run checks that an error raised mid-run prints as one clean line.
"""

from __future__ import annotations

import sys
import types

import pytest

from credo.config import ConfigError, TaskConfig, TinyModelConfig, load_recipe
from credo.models import build_char_tokenizer, check_vocab, load_tokenizer, resolve_model_path
from credo.tasks import ArithmeticTask, make_task
from tests.e2e.common import tiny_overrides
from tests.reliability.common import run_cli_expecting_error


# --------------------------------------------------------------------------------------- model, tokenizer


def test_missing_model_path():
    with pytest.raises(ConfigError, match=r"model.path '/no/such/model' does not exist \(expected 'tiny', a local "
                                          r"Hugging Face model directory or a hub id\)"):
        resolve_model_path("/no/such/model", TinyModelConfig())


def test_a_missing_relative_folder_beside_its_parent_is_missing_not_a_hub_id(tmp_path, monkeypatch):
    """#36 item 9: `model.path=models/nope` with a models/ folder here is a typo in a local path; an 'org/name'
    without such a folder stays a hub id for the loader."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(ConfigError, match=r"model.path 'models/nope' does not exist \(expected 'tiny', a local"):
        resolve_model_path("models/nope", TinyModelConfig())
    assert resolve_model_path("some-org/nope", TinyModelConfig()) == "some-org/nope"


def test_model_dir_without_config(tmp_path):
    with pytest.raises(ConfigError, match=f"model.path '{tmp_path}' exists but has no config.json: expected a Hugging "
                                          "Face model directory"):
        resolve_model_path(str(tmp_path), TinyModelConfig())


def test_model_dir_without_tokenizer(tmp_path):
    with pytest.raises(ConfigError, match=f"model.path '{tmp_path}': could not load a tokenizer"):
        load_tokenizer(str(tmp_path))


def test_tokenizer_without_pad_token_pads_with_eos(tmp_path, caplog):
    """As TRL does: PAD = EOS, with a warning naming the tokenizer (tests/byo checks it is logged once)."""
    tok = build_char_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="credo"):
        loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == "<eos>" and loaded.pad_token_id == loaded.eos_token_id
    assert f"tokenizer at '{tmp_path}' has no pad_token: using its eos_token" in caplog.text


def test_tokenizer_without_eos_token(tmp_path):
    tok = build_char_tokenizer()
    tok.eos_token = None
    tok.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=f"tokenizer at '{tmp_path}' has no eos_token: expected one"):
        load_tokenizer(str(tmp_path))


def test_tokenizer_larger_than_embedding():
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_char_tokenizer()  # 4 specials + 96 characters
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    with pytest.raises(ConfigError, match=f"vocab mismatch at 'm': tokenizer has {len(tok)} tokens but the model's "
                                          "embedding has 64 rows; expected at most 64 tokens"):
        check_vocab(model, tok, "m")
    check_vocab(LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=1, num_key_value_heads=1)), tok, "m")  # padded: fine


# ------------------------------------------------------------------------------------------------- data


def test_empty_train_split_is_a_recipe_error():
    with pytest.raises(ConfigError, match=r"config key 'task.train_size' = 0 is out of range: expected >= 1"):
        load_recipe("recipes/quickstart.yaml", ["task.train_size=0"])


def test_eval_split_taking_every_problem():
    with pytest.raises(ConfigError, match=r"task.eval_size = 100 leaves no training problems \(the task has 100\)"):
        ArithmeticTask(train_size=10, eval_size=100, seed=0, max_operand=9)


@pytest.fixture
def fake_reasoning_gym(monkeypatch):
    """A stand-in `reasoning_gym` whose dataset 'toy' yields the entries a test puts in `rows`."""
    rows: dict[str, list] = {"train": [], "eval": []}
    mod = types.ModuleType("reasoning_gym")
    mod.factory = types.SimpleNamespace(DATASETS={"toy": object()})

    def create_dataset(name, size, seed):
        return rows["train" if seed < 1_000_003 else "eval"][:size]

    mod.create_dataset = create_dataset
    monkeypatch.setitem(sys.modules, "reasoning_gym", mod)
    return rows


def rg_task(train_size=2, eval_size=2):
    return make_task(TaskConfig(name="rg:toy", train_size=train_size, eval_size=eval_size))


def test_rg_entry_missing_field(fake_reasoning_gym):
    fake_reasoning_gym["train"] = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "solution": "4"}]
    fake_reasoning_gym["eval"] = [{"question": "3+3?", "answer": "6"}]
    with pytest.raises(ConfigError, match=r"task 'rg:toy' train entry 1 is missing the field 'answer' \(expected "
                                          r"'question' and 'answer'; it has \['question', 'solution'\]\)"):
        rg_task()


def test_rg_entry_not_a_dict(fake_reasoning_gym):
    fake_reasoning_gym["train"] = [{"question": "1+1?", "answer": "2"}]
    fake_reasoning_gym["eval"] = ["3+3?"]
    with pytest.raises(ConfigError, match=r"task 'rg:toy' eval entry 0 is a str, expected a dict with 'question'"):
        rg_task()


def test_rg_empty_train_split(fake_reasoning_gym):
    with pytest.raises(ConfigError, match=r"task 'rg:toy' has an empty train split: expected task.train_size >= 1"):
        rg_task()


def test_rg_eval_split_all_in_train(fake_reasoning_gym):
    fake_reasoning_gym["train"] = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    fake_reasoning_gym["eval"] = [{"question": "2+2?", "answer": "4"}]
    task = rg_task()  # the split is found when it is first read (a run reads it before its warm-up)
    with pytest.raises(ConfigError, match=r"task 'rg:toy' has an empty eval split: all 1 held-out entries also occur"):
        task.eval_problems()


class _CountingSplit(list):
    """A split that counts the entries read from it (reasoning-gym generates each entry when it is read)."""
    reads = 0

    def __getitem__(self, i):
        if isinstance(i, slice):  # the fake's create_dataset slices the rows to `size`
            return _CountingSplit(super().__getitem__(i))
        _CountingSplit.reads += 1
        return super().__getitem__(i)


def test_rg_task_built_without_reading_its_whole_train_split(fake_reasoning_gym):
    """`credo check` builds the task: it must not generate all train_size entries (minutes for rg:countdown)."""
    fake_reasoning_gym["train"] = _CountingSplit({"question": f"{i}+1?", "answer": str(i + 1)} for i in range(5000))
    fake_reasoning_gym["eval"] = [{"question": "0+1?", "answer": "1"}, {"question": "x?", "answer": "y"}]
    _CountingSplit.reads = 0
    task = rg_task(train_size=5000)
    assert _CountingSplit.reads <= 64
    assert [p.answer for p in task.eval_problems()] == ["y"]  # still held out against the whole train split
    assert _CountingSplit.reads >= 5000


def test_rg_good_entries_load(fake_reasoning_gym):
    fake_reasoning_gym["train"] = [{"question": "1+1?", "answer": 2}]
    fake_reasoning_gym["eval"] = [{"question": "1+1?", "answer": 2}, {"question": "3+3?", "answer": 6}]
    task = rg_task()
    assert task.train(0).answer == "2"
    assert [p.answer for p in task.eval_problems()] == ["6"]  # the question seen in training is held out of eval


# --------------------------------------------------------------------------- checks inside the trainer


def test_prompt_longer_than_context(tmp_path):
    from credo.trainer import Trainer

    # arithmetic prompts 'a+b=' are 4 tokens; with 4 new tokens they need a context of 8
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"model.tiny.max_position_embeddings": 6}))
    with pytest.raises(ConfigError, match=r"prompt too long: eval problem 0 has 4 tokens \+ rollout.max_new_tokens=4 > "
                                          r"the model's context of 6 tokens \(max_position_embeddings\); shorten"):
        Trainer(r)


def test_output_dir_holding_a_run_needs_resume(tmp_path):
    from credo.trainer import Trainer

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.0}\n')
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"config key 'run.output_dir' = '.*/run' already holds a run \(metrics.jsonl\); "
                                          r"expected run.resume=auto to continue it, or a new run.output_dir"):
        Trainer(r)


@pytest.mark.parametrize("make, problem", [
    (lambda p: None, "the folder does not exist"),
    (lambda p: p.mkdir(), "meta.json is missing"),
])
def test_resume_path_not_a_checkpoint(tmp_path, make, problem):
    from credo.trainer import Trainer

    ckpt = tmp_path / "step_00000002"
    make(ckpt)
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"run.resume": str(ckpt)}))
    with pytest.raises(ConfigError, match=f"config key 'run.resume' = '{ckpt}': not a usable checkpoint \\({problem}"):
        Trainer(r)


# ------------------------------------------------------------------------------ the reward contract, via the CLI


@pytest.mark.slow
def test_reward_contract_error_prints_cleanly(tmp_path):
    """Raised mid-run (step 1): one line naming the function, exit code 1, no traceback. A non-number takes
    the same path (its message is tested in test_reward_worker.py)."""
    run_cli_expecting_error(["run", "recipes/quickstart.yaml"] + tiny_overrides(
        tmp_path / "run", **{"reward.function": "tests.e2e.rewards:wrong_length"}),
        exit_code=1, message="credo: error: reward function 'wrong_length' returned 5 rewards for 4 responses")
