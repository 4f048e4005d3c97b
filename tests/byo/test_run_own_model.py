"""End to end, a TRL user's setup: own chat-template Qwen2 (no pad token), JSONL data, two TRL-style reward
functions. The run trains, logs both rewards, evaluates with the weighted reward, and exports final/ that
from_pretrained loads and that decodes greedily as the trainer does; `credo export` writes the same model."""

import json
import logging

import pytest
import torch

from credo.config import load_recipe
from tests.byo.common import make_model_dir, qa_rows, write_jsonl
from tests.e2e.common import read_rows, run_cli

pytestmark = pytest.mark.slow


def byo_overrides(tmp_path, model_dir, *, chat: bool = False, **extra) -> list[str]:
    train = write_jsonl(tmp_path / "train.jsonl", qa_rows(40, seed=1, chat=chat))
    ev = write_jsonl(tmp_path / "eval.jsonl", qa_rows(8, seed=2, chat=chat))
    o = {
        "run.output_dir": str(tmp_path / "run"), "run.steps": 3, "run.eval_every": 3, "run.save_every": 3,
        "run.progress": False, "run.plot": False, "run.seed": 0, "run.threads": 1,
        "model.path": str(model_dir),
        "task.name": "file", "task.kwargs": f"{{train: {train}, eval: {ev}}}", "task.system_prompt": "Answer briefly.",
        "task.eval_size": 8,
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 6,
        "algo.micro_batch_size": 8, "optim.lr": 1e-3,
        "reward.functions": "[tests.byo.rewards:has_digit, tests.byo.rewards:length_penalty]",
        "reward.weights": "[1.0, 0.5]",
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def test_jsonl_chat_model_two_trl_rewards_train_log_and_export(tmp_path, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from credo.tasks.render import encode_prompts
    from credo.trainer import Trainer
    from tests.byo import rewards

    model_dir = make_model_dir(tmp_path / "my-model")  # no pad token: pad = eos with a warning
    r = load_recipe(None, byo_overrides(tmp_path, model_dir, **{"run.name": "byo"}))
    assert r.sft.enabled is False  # own model: no warm-up unless the recipe asks for one
    rewards.CALLS.clear()
    with caplog.at_level(logging.WARNING, logger="credo"):
        trainer = Trainer(r)
    assert sum("has no pad_token" in m for m in caplog.messages) == 1
    tok = trainer.c.tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    before = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
    run_dir = trainer.fit()
    try:
        after = dict(trainer.engine.module.named_parameters())
        assert any(not torch.equal(before[k], after[k].detach()) for k in before)
        rows = read_rows(run_dir)
        assert [row["step"] for row in rows] == [0, 1, 2, 3]
        for row in rows[1:]:
            assert set(row) >= {"train/rewards/has_digit", "train/rewards/length_penalty", "train/reward_mean"}
            assert 0.0 <= row["train/rewards/has_digit"] <= 1.0
            assert row["train/rewards/length_penalty"] < 0  # -0.1 per token, every response has >= 1
        # the step's reward is the weighted sum; its mean cannot exceed has_digit's mean (the penalty is < 0)
        assert rows[1]["train/reward_mean"] <= rows[1]["train/rewards/has_digit"] + 1e-9
        assert "eval/reward_mean" in rows[0] and "eval/reward_mean" in rows[-1] and "eval/accuracy" not in rows[0]
        # the functions got TRL's keywords, the data set's other columns, and chat-rendered prompts' raw form
        call = rewards.CALLS[0]
        assert set(call) >= {"prompts", "completion_ids", "answer", "level", "completions"}
        assert isinstance(call["prompts"][0], str) and call["prompts"][0].startswith("what is ")

        # rollout prompts went through the chat template with the system prompt
        eval_problems = trainer.c.task.eval_problems()
        prompts = encode_prompts(tok, trainer.source.render, eval_problems)
        text = tok.decode(prompts[0])
        assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>") and text.endswith("<|im_start|>assistant\n")

        final = run_dir / "final"
        assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
        loaded = AutoModelForCausalLM.from_pretrained(final).eval()
        loaded_tok = AutoTokenizer.from_pretrained(final)
        assert loaded_tok.chat_template == tok.chat_template and loaded_tok.pad_token == tok.eos_token
        for k, v in loaded.state_dict().items():
            assert torch.equal(v, trainer.engine.module.state_dict()[k].cpu()), k
        assert len(prompts) == 8
        for ids in prompts:  # one prompt at a time: no padding on either side
            ours = trainer.source.generate([ids], temperature=1.0, seeds=None)[0].response_ids
            out = loaded.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  do_sample=False, max_new_tokens=6, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id)
            theirs = out[0, len(ids):].tolist()
            if tok.eos_token_id in theirs:
                theirs = theirs[:theirs.index(tok.eos_token_id) + 1]
            assert list(ours) == theirs
    finally:
        trainer.close()

    ckpt = run_dir / "checkpoints" / "step_00000003"
    res = run_cli(["export", str(ckpt), str(tmp_path / "exported")], timeout=300)
    assert res.returncode == 0, res.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    for k, v in exported.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["model_type"] == "qwen2"


def test_chat_message_prompts_and_hf_saved_dataset_train(tmp_path):
    """Prompts as lists of chat messages, read with task.name hf:<folder saved with save_to_disk>."""
    import datasets

    from credo.trainer import train

    model_dir = make_model_dir(tmp_path / "m", pad=True)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(qa_rows(40, seed=1, chat=True)),
                          "test": datasets.Dataset.from_list(qa_rows(8, seed=2, chat=True))}).save_to_disk(tmp_path / "ds")
    r = load_recipe(None, byo_overrides(tmp_path, model_dir, chat=True, **{
        "run.name": "byo-hf", "task.name": f"hf:{tmp_path / 'ds'}", "task.kwargs": "{train: train, eval: test}",
        "run.steps": 1, "run.eval_every": 1, "run.save_every": 0,
        "reward.functions": "[]", "reward.weights": "[]",
        "reward.function": "tests.byo.rewards:named_only"}))  # one TRL-style function under the old key
    rows = read_rows(train(r))
    assert "train/rewards/named_only" in rows[1] and "eval/reward_mean" in rows[1]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_zero3_final_and_export_hold_the_gathered_weights(tmp_path):
    """Under ZeRO-3 the partitioned weights are gathered for final/, and `credo export` merges the
    checkpoint's partitions: both equal the trained weights."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    from credo.export import export_checkpoint
    from credo.trainer import Trainer

    model_dir = make_model_dir(tmp_path / "m", pad=True)
    r = load_recipe(None, byo_overrides(tmp_path, model_dir, **{
        "run.name": "z3", "run.steps": 1, "run.eval_every": 0, "run.save_every": 1, "optim.zero_stage": 3}))
    trainer = Trainer(r)
    try:
        run_dir = trainer.fit()
        module = trainer.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            trained = {k: v.detach().clone() for k, v in module.state_dict().items()}
    finally:
        trainer.close()
    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final").state_dict()
    exported = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(run_dir / "checkpoints" / "step_00000001", tmp_path / "exp")).state_dict()
    assert any(not torch.equal(base[k], final[k]) for k in base)  # it trained
    for k, v in final.items():
        assert v.shape == base[k].shape and torch.equal(v, trained[k]), k
        assert torch.allclose(exported[k], v, atol=1e-6), k
