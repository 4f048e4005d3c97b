"""LoRA (model.lora) and gradient checkpointing (model.gradient_checkpointing) without a trainer: merged weights
against PEFT's own merge, the KL reference with the adapter off against the base model, the target checks, and
gradient checkpointing's loss and gradients against a run without it (on the scorer's hidden-state path and on
the fused log-prob loss)."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.config import ConfigError, LoraConfig, TinyModelConfig, load_recipe
from credo.lora import BaseReference, add_lora, has_lora, policy_state_dict
from credo.models import build_tiny_model, load_causal_lm
from credo.train.scoring import policy_forward

TINY = TinyModelConfig(num_layers=2, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def base_dir():
    return str(build_tiny_model(TINY))


def lora_model(base_dir, seed=0, **kw):
    """The tiny model with an adapter whose B is random (PEFT starts B at 0, which would hide any error)."""
    model = load_causal_lm(base_dir)
    peft_model = add_lora(model, LoraConfig(r=4, alpha=8.0, **kw), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model, peft_model


def batch(n=3, length=12, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 90, (n, length), generator=gen)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # a left-padded row
    mask = torch.zeros(n, length - 1, dtype=torch.bool)
    mask[:, 5:] = True
    return ids, attn, mask


def test_only_the_adapter_trains_and_the_head_stays_plain(base_dir):
    model, _ = lora_model(base_dir)
    torch.manual_seed(123)  # the adapter's initialisation does not depend on the global RNG
    again = lora_model(base_dir)[0].state_dict()
    assert all(torch.equal(v, again[k]) for k, v in model.state_dict().items())
    other = load_causal_lm(base_dir)
    add_lora(other, LoraConfig(r=4, alpha=8.0), seed=1)
    assert not torch.equal(other.state_dict()["model.layers.0.self_attn.q_proj.lora_A.default.weight"],
                           again["model.layers.0.self_attn.q_proj.lora_A.default.weight"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear) and has_lora(model)
    assert not has_lora(load_causal_lm(base_dir))


def test_merged_weights_equal_peft_merge_and_unload(base_dir):
    model, peft_model = lora_model(base_dir)
    ours = policy_state_dict(model)
    merged = copy.deepcopy(peft_model).merge_and_unload()  # PEFT's own merge on a copy
    theirs = merged.state_dict()
    assert list(ours) == list(theirs)
    for k in theirs:
        assert torch.allclose(ours[k], theirs[k], atol=1e-6, rtol=0), k
    # and the merged model computes what the adapter model computes
    ids, attn, _ = batch()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids, attention_mask=attn).logits,
                              model(input_ids=ids, attention_mask=attn).logits, atol=1e-5)
    # a wrapped layer's weight really moved (B is not 0)
    base = load_causal_lm(base_dir).state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(ours[q], base[q])


def test_without_an_adapter_the_state_dict_is_the_models(base_dir):
    model = load_causal_lm(base_dir)
    ours, theirs = policy_state_dict(model), model.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_the_reference_is_the_base_model_without_a_copy(base_dir):
    from credo.train.scoring import PolicyScorer

    model, peft_model = lora_model(base_dir)
    ids, attn, mask = batch()
    scorer = PolicyScorer(temperature=0.7, chunk_size=5, hidden_path=True, needs_old_log_probs=False)
    with torch.no_grad():
        ref, _ = scorer(BaseReference(peft_model), ids, attn, mask, with_entropy=False)
        base, _ = scorer(load_causal_lm(base_dir), ids, attn, mask, with_entropy=False)
        policy, _ = scorer(model, ids, attn, mask, with_entropy=False)
    assert torch.equal(ref, base)
    assert (policy - base).abs()[mask].max() > 1e-3  # the adapter is on again after the reference's forward
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("targets, words", [
    (["nope_proj"], "config key 'model.lora.target_modules' = ['nope_proj']"),
    (["lm_head"], "wraps 'lm_head' (the output head)"),
    (["embed_tokens"], "wraps 'model.embed_tokens' (the input embedding)"),
])
def test_bad_targets_are_config_errors(base_dir, targets, words):
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        add_lora(load_causal_lm(base_dir), LoraConfig(r=4, target_modules=targets))


def test_check_names_the_key_before_any_warm_up():
    from credo.train.build import check_run

    base = ["run.name=t", "model.lora.r=4"]
    with pytest.raises(ConfigError, match="wraps 'lm_head'"):
        check_run(load_recipe("recipes/quickstart.yaml", base + ["model.lora.target_modules=[lm_head]"]))
    with pytest.raises(ConfigError, match=r"'engine.zero_stage' = 3 is out of range: expected <= 2 with model.lora"):
        load_recipe("recipes/quickstart.yaml", base + ["engine.zero_stage=3"])
    with pytest.raises(ConfigError, match="'rollout.fp8_weights' = True is not supported with model.lora"):
        load_recipe("recipes/quickstart.yaml", base + ["rollout.fp8_weights=true"])
    with pytest.raises(ConfigError, match=r"'model.lora.r' = -1 is out of range"):
        load_recipe("recipes/quickstart.yaml", ["model.lora.r=-1"])
    check_run(load_recipe("recipes/quickstart.yaml", base + ["model.lora.target_modules=[q_proj, v_proj]"]))


# ------------------------------------------------------------------------------------ gradient checkpointing

def loss_and_grads(model, *, fused: bool):
    """The update's loss on the scorer's hidden-state path (chunked log-probs + entropy), or the fused log-prob
    loss on the model's last hidden states; its value and every trainable parameter's gradient."""
    from credo.algos import fused_policy_loss_from_hidden

    ids, attn, mask = batch(n=4, length=16)
    adv = torch.linspace(-1, 1, mask.numel()).view(mask.shape)
    model.zero_grad(set_to_none=True)
    if fused:
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1][mask]
        loss, _, _ = fused_policy_loss_from_hidden(
            hidden, model.lm_head.weight, ids[:, 1:][mask], lambda lp, ent, a: -(lp * a) - 0.01 * ent,
            token_inputs=(adv[mask],), temperature=0.9, chunk_size=7, with_entropy=True)
    else:
        lp, ent = policy_forward(model, ids, attn, mask, temperature=0.9, chunk_size=7, with_entropy=True)
        loss = (-(lp * adv) - 0.01 * ent)[mask].sum() / mask.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("fused", [False, True], ids=["scorer", "fused"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(base_dir, lora, fused):
    plain = lora_model(base_dir)[0] if lora else load_causal_lm(base_dir)
    ckpt = lora_model(base_dir)[0] if lora else load_causal_lm(base_dir)
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt.train()  # the updater's mode with checkpointing on; the plain model stays in eval mode, as the trainer has it
    calls = []
    ckpt.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))  # a post hook misses the recompute
    # (torch stops it early, once the saved tensors are back)
    loss_a, grads_a = loss_and_grads(plain, fused=fused)
    loss_b, grads_b = loss_and_grads(ckpt, fused=fused)
    assert len(calls) == 2  # the block's forward ran again in the backward: checkpointing was on
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for k in grads_a:
        assert torch.allclose(grads_a[k], grads_b[k], atol=1e-7, rtol=1e-5), k
    assert all(g.abs().max() > 0 for g in grads_a.values())
