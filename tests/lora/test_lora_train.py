"""LoRA in the trainer (model.lora): on ZeRO 0, 1 and 2 only the adapter moves, the base weights stay bit for bit,
the KL reference is the base model; final/ (merged) and `credo export --adapter` load with transformers / peft and
give the trainer's log-probs; the merged export of the last checkpoint is final/."""

from __future__ import annotations

import json

import pytest
import torch

from credo.config import load_recipe
from tests.e2e.common import read_rows, run_cli, tiny_overrides

pytestmark = pytest.mark.slow

LORA = {"model.lora.r": 4, "model.lora.alpha": 8.0, "model.ref_model": True, "algo.kl_coef": 0.05,
        "algo.ppo_epochs": 2, "optim.lr": 1e-2, "run.save_every": 3}


def run_lora(out, **extra):
    from credo.trainer import Trainer

    trainer = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(out, **{**LORA, **extra})))
    trainer.fit()
    return trainer


def scores(model, ids, attn, mask):
    from credo.train.scoring import policy_forward

    with torch.no_grad():
        return policy_forward(model, ids, attn, mask, temperature=1.0, chunk_size=64, with_entropy=False)[0]


def probe_batch(trainer):
    """Held-out prompts with a few generated tokens each, as the scorer sees a batch."""
    from credo.tasks.render import encode_prompts

    prompts = encode_prompts(trainer.c.tokenizer, trainer.source.render, trainer.c.task.eval_problems()[:6])
    width = max(map(len, prompts)) + 4
    ids = torch.tensor([[0] * (width - len(p) - 4) + p + [5, 6, 7, 8] for p in prompts])
    attn = (ids != 0).long()
    mask = torch.zeros(ids.shape[0], width - 1, dtype=torch.bool)
    mask[:, -4:] = True
    return ids, attn, mask


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_only_the_adapter_trains_on_every_zero_stage(tmp_path, zero_stage):
    from credo.models import load_causal_lm

    trainer = run_lora(tmp_path / "run", **{"optim.zero_stage": zero_stage, "run.steps": 1, "run.eval_every": 0,
                                            "run.save_every": 0})
    try:
        module = trainer.engine.module
        base = load_causal_lm(trainer.c.state.policy_path).state_dict()
        live = module.state_dict()
        for k, v in base.items():
            key = k if k in live else k.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
            assert torch.equal(live[key], v), k  # the base weights did not move
        moved = [n for n, p in module.named_parameters() if "lora_B" in n and p.detach().abs().max() > 0]
        assert moved  # B starts at 0; the update moved it
        opt = trainer.engine.optimizer  # ZeRO 1-2 keep the module's parameters in bit16_groups
        groups = getattr(opt, "bit16_groups", None) or [g["params"] for g in opt.param_groups]
        assert {id(p) for g in groups for p in g} == {id(p) for n, p in module.named_parameters() if "lora_" in n}
        rows = read_rows(trainer.run_dir)
        assert rows[-1]["train/kl"] > 0  # the second epoch's policy is not the reference (the adapter off) any more
    finally:
        trainer.close()


def test_final_and_exports_load_with_transformers_and_peft_and_score_as_the_trainer(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = run_lora(tmp_path / "run", **{"run.steps": 3})
    try:
        ids, attn, mask = probe_batch(trainer)
        ours = scores(trainer.engine.module, ids, attn, mask)
        base = AutoModelForCausalLM.from_pretrained(trainer.c.state.policy_path)
        assert (ours - scores(base, ids, attn, mask))[mask].abs().max() > 1e-4  # the adapter changed the policy
        final = trainer.run_dir / "final"
        merged = AutoModelForCausalLM.from_pretrained(final)
        assert not any("lora" in k for k in merged.state_dict())
        assert torch.allclose(scores(merged, ids, attn, mask), ours, atol=1e-5)

        ckpt = trainer.run_dir / "checkpoints" / "step_00000003"
        res = run_cli(["export", str(ckpt), str(tmp_path / "adapter"), "--adapter"], timeout=300)
        assert res.returncode == 0, res.stderr
        config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
        assert config["r"] == 4 and config["lora_alpha"] == 8.0
        assert config["base_model_name_or_path"] == trainer.c.state.policy_path
        base_again = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
        with_adapter = PeftModel.from_pretrained(base_again, tmp_path / "adapter")
        assert torch.allclose(scores(with_adapter.get_base_model(), ids, attn, mask), ours, atol=1e-6)

        res = run_cli(["export", str(ckpt), str(tmp_path / "merged")], timeout=300)
        assert res.returncode == 0, res.stderr
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
        for k, v in merged.state_dict().items():
            assert torch.equal(exported[k], v), k
    finally:
        trainer.close()


def test_export_adapter_of_a_full_fine_tuning_run_is_an_error(tmp_path):
    res = run_cli(["run", "recipes/quickstart.yaml", *tiny_overrides(tmp_path / "run", **{
        "run.steps": 1, "run.eval_every": 0, "run.save_every": 1})])
    assert res.returncode == 0, res.stderr
    res = run_cli(["export", str(tmp_path / "run" / "checkpoints" / "step_00000001"), str(tmp_path / "a"), "--adapter"])
    assert res.returncode == 1 and "was trained without model.lora, so it has no adapter" in res.stderr


def test_gradient_checkpointing_in_the_trainer_changes_no_metric(tmp_path):
    """LoRA runs with and without model.gradient_checkpointing log the same rows (perf/* aside), and with it the
    update's forwards really are checkpointed: each block runs again in the backward."""
    from credo.trainer import Trainer

    rows = {}
    for gc in (False, True):
        out = tmp_path / f"gc{gc}"
        trainer = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(out, **{
            **LORA, "run.steps": 2, "run.eval_every": 0, "run.save_every": 0, "model.gradient_checkpointing": gc})))
        try:
            in_update, calls = [False], []  # first block's forwards during the updates only
            trainer.engine.module.model.layers[0].register_forward_pre_hook(
                lambda *a: calls.append(1) if in_update[0] else None)
            update = trainer.updater.update

            def counted_update(batch):
                in_update[0] = True
                try:
                    return update(batch)
                finally:
                    in_update[0] = False
                    assert not trainer.engine.module.training  # the update's train mode does not leak

            trainer.updater.update = counted_update
            trainer.fit()
            rows[gc] = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_rows(trainer.run_dir)]
            u = trainer.updater
            assert len(calls) == 2 * u.ppo_epochs * u.mini_batches * u.grad_accum * (2 if gc else 1)
        finally:
            trainer.close()
    assert json.dumps(rows[False]) == json.dumps(rows[True])
