"""The training engines behind one interface: FSDP2 against DeepSpeed ZeRO-1 on the same tiny model and batches.

On one process both run a torch AdamW with DeepSpeed's clipping (the FSDP2 engine copies its formula), so every
parameter, gradient norm and learning rate must agree bit for bit, through clipped steps, an accumulation of two
micro-batches and a step skipped for a non-finite loss. The FSDP2 engine's in-memory rollback and its DCP
checkpoint must each give back a state that trains on exactly as before. The whole-run comparisons (CLI, SIGKILL
resume, two processes under torchrun) are in tests/engines/test_fsdp2_runs.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.distributed.engine import setup_distributed
from credo.distributed.engines import CAPABILITIES, TrainEngine, check_engine, make_engine

SETTINGS = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01, grad_clip=0.5, warmup_steps=2, micro_batch=2,
                grad_accum=2, bf16=False, zero_stage=1)


def tiny_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg)


def batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 48, (2, 9), generator=g, device="cpu") for _ in range(n)]


def loss_of(engine, ids: torch.Tensor) -> torch.Tensor:
    logits = engine.module(input_ids=ids).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()) * 3.0  # big enough to clip


def train(engine, data, nan_at=()) -> list[tuple]:
    """One micro-batch per element of `data`; returns (finite, grad norm, lr) per optimizer step."""
    out = []
    for i, ids in enumerate(data):
        loss = loss_of(engine, ids)
        if i in nan_at:
            loss = engine.nan_loss(loss * float("nan"))
        engine.backward(loss, 1)
        finite, norm = engine.step()
        if norm is not None or (i + 1) % 2 == 0:
            out.append((finite and engine.step_applied(), engine.grad_norm(norm), engine.lr()))
    return out


def full_params(engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.full_state_dict().items()}


@pytest.fixture(scope="module")
def world():
    return setup_distributed()


def test_both_engines_implement_the_interface_and_declare_known_capabilities(world):
    for backend in ("deepspeed", "fsdp2"):
        e = make_engine(backend, tiny_model(), **SETTINGS)
        assert isinstance(e, TrainEngine) and e.backend == backend
        assert e.capabilities and e.capabilities <= set(CAPABILITIES), e.capabilities - set(CAPABILITIES)
    assert "zero3_gather" not in e.capabilities
    assert {"dcp_checkpoint", "sharded_params", "gathered_weight_push", "lora"} <= e.capabilities


def test_fsdp2_trains_as_deepspeed_zero1_bit_for_bit_with_clipping_and_a_skipped_step(world):
    data = batches(8)
    ds, fs = make_engine("deepspeed", tiny_model(), **SETTINGS), make_engine("fsdp2", tiny_model(), **SETTINGS)
    a, b = train(ds, data, nan_at=(4,)), train(fs, data, nan_at=(4,))
    assert [s[0] for s in a] == [True, True, False, True], a  # the third optimizer step is skipped (NaN loss)
    assert a[0][1] > SETTINGS["grad_clip"], "the clip must be active for its maths to be compared"
    assert [(f, n, lr) for f, n, lr in a if f] == [(f, n, lr) for f, n, lr in b if f]
    pa, pb = full_params(ds), full_params(fs)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_fsdp2_rollback_and_dcp_checkpoint_train_on_exactly(world, tmp_path):
    data = batches(6)
    e = make_engine("fsdp2", tiny_model(), **SETTINGS)
    train(e, data[:2])
    snap, before = e.state_dict(), full_params(e)
    first = train(e, data[2:4]), full_params(e)
    e.load_state_dict(snap)
    assert all(torch.equal(before[k], v) for k, v in full_params(e).items())
    assert (train(e, data[2:4]), full_params(e))[0] == first[0]
    assert all(torch.equal(first[1][k], v) for k, v in full_params(e).items())
    # DCP: save, train on, load into a fresh engine: the next steps are the same as the original's
    e.save_checkpoint(tmp_path)
    lr_saved = e.lr()
    ref = train(e, data[4:6]), full_params(e)
    fresh = make_engine("fsdp2", tiny_model(seed=7), **SETTINGS)
    fresh.load_checkpoint(tmp_path)
    assert fresh.lr() == lr_saved and fresh.global_steps == 2
    got = train(fresh, data[4:6]), full_params(fresh)
    assert got[0] == ref[0]
    assert all(torch.equal(ref[1][k], v) for k, v in got[1].items())


def test_a_push_an_engine_cannot_make_is_still_refused_naming_both_keys():
    """Overlap's workers need `replica_push`, which ZeRO-3 (partitions no push gathers for them) does not give."""
    from credo.plan import resolve_plan

    r = load_recipe("recipes/quickstart.yaml", ["engine.zero_stage=3", "stages.schedule=overlap"])
    with pytest.raises(ConfigError, match="config keys 'stages.schedule'.* and 'engine.zero_stage' = 3 .*do not "
                                          "combine: the first needs 'replica_push'"):
        resolve_plan(r)


@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
def test_lora_with_overlap_is_refused_under_either_engine(backend):
    """The weight buffer copies the policy's parameters (lora_A/lora_B among them) into plain base-model workers:
    the first publish raised a size mismatch after the warm-up; `credo check` now refuses it, naming both keys."""
    from credo.plan import resolve_plan

    r = load_recipe("recipes/quickstart.yaml", [f"engine.backend={backend}", "model.lora.r=8",
                                                 "stages.schedule=overlap"])
    with pytest.raises(ConfigError, match="config keys 'model.lora.r' and 'stages.schedule' cannot be used together"):
        resolve_plan(r)


def test_cpu_offload_is_an_fsdp2_setting():
    with pytest.raises(ConfigError, match="'engine.cpu_offload'"):
        check_engine(load_recipe("recipes/quickstart.yaml", ["engine.cpu_offload=true"]))


def test_fsdp2_accepts_the_pushes_it_gathers_for_and_lora():
    """rollout.dtype / rollout.fp8_weights (the MIPU recipe), the vLLM backend, the Ray pool and overlap's workers take
    FSDP2's gathered weights, LoRA's merged (tests/engines/test_fsdp2_runs.py trains each against deepspeed)."""
    from credo.plan import resolve_plan

    for over in (["rollout.dtype=bfloat16"], ["rollout.backend=vllm", "rollout.fp8_weights=true"],
                 ["stages.schedule=overlap"], ["cluster.engine=ray", "rollout.backend=vllm"],
                 ["model.lora.r=8", "rollout.backend=vllm"]):
        resolve_plan(load_recipe("recipes/quickstart.yaml", ["engine.backend=fsdp2", *over]))


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_fsdp2_weight_push_gives_deepspeeds_names_dtypes_and_values(world):
    """Every push reads the same tensors under either engine: the vLLM/Ray state dict (names, tied alias once,
    dtypes, values), bucketed or not, the hf rollout copy in bf16 with FP8 linears, and overlap's weight buffer."""
    from credo.distributed.engines.weights import weight_buckets
    from credo.distributed.rollout_copy import RolloutCopy
    from credo.distributed.weight_buffer import WeightBuffers
    from credo.distributed.weight_sync import full_state_dict

    data = batches(2)
    ds, fs = make_engine("deepspeed", tiny_model(), **SETTINGS), make_engine("fsdp2", tiny_model(), **SETTINGS)
    train(ds, data), train(fs, data)
    a, b = full_state_dict(ds.module), full_state_dict(fs.module)
    _same(a, b)
    assert all(not hasattr(v, "to_local") for v in b.values()), "plain tensors, not DTensors"
    small = list(weight_buckets(fs.module, bucket_bytes=1))  # one tensor per bucket
    assert len(small) == len(b) and dict(t for bk in small for t in bk).keys() == b.keys()
    ca, cb = (RolloutCopy(e.module, dtype="bfloat16", fp8_weights=True) for e in (ds, fs))
    _same(ca.module.state_dict(), cb.module.state_dict())
    assert all(p.dtype == torch.bfloat16 for p in cb.module.parameters())
    ctx = torch.multiprocessing.get_context("spawn")
    wa, wb = WeightBuffers(ds.module, ctx), WeightBuffers(fs.module, ctx)
    train(ds, data), train(fs, data)
    ca.sync_from(ds.module), cb.sync_from(fs.module), wa.publish(ds.module, 1, timeout_s=5), wb.publish(fs.module, 1,
                                                                                                          timeout_s=5)
    _same(ca.module.state_dict(), cb.module.state_dict())
    assert wa.names == wb.names and all(torch.equal(x, y) for x, y in zip(wa.slots[0], wb.slots[0]))


def test_fsdp2_pushes_bf16_as_deepspeeds_bf16_module_does(world):
    """Mixed precision keeps fp32 master shards; the push casts them to bf16, the dtype DeepSpeed's module holds."""
    from credo.distributed.weight_sync import full_state_dict

    bf16 = {**SETTINGS, "bf16": True}
    ds, fs = make_engine("deepspeed", tiny_model(), **bf16), make_engine("fsdp2", tiny_model(), **bf16)
    a, b = full_state_dict(ds.module), full_state_dict(fs.module)
    assert {v.dtype for v in b.values()} == {torch.bfloat16}
    _same(a, b)


def test_fsdp2_trains_a_lora_adapter_and_pushes_its_merged_weights_as_deepspeed(world):
    """A PEFT adapter inside FSDP2's blocks trains as under DeepSpeed (norms, LRs), and the push and the full state
    dict give the merged weights, W + (alpha / r) B A under the base names, bit for bit (the adapter's matrices
    gathered and folded in with their base weight)."""
    from credo.lora import add_lora
    from credo.distributed.weight_sync import full_state_dict

    lora = load_recipe("recipes/quickstart.yaml", ["model.lora.r=4", "model.lora.alpha=8.0"]).model.lora

    def build(backend):
        m = tiny_model()
        add_lora(m, lora, seed=0)
        return make_engine(backend, m, **{**SETTINGS, "lr": 3e-2})

    ds, fs = build("deepspeed"), build("fsdp2")
    data = batches(2)
    assert train(ds, data) == train(fs, data)
    pushed = full_state_dict(fs.module)
    _same(full_state_dict(ds.module), pushed)
    assert not any("lora_" in k or "base_layer" in k for k in pushed)
    assert not torch.equal(pushed["model.layers.0.self_attn.q_proj.weight"],
                           fs.module.state_dict()["model.layers.0.self_attn.q_proj.base_layer.weight"].full_tensor())
    _same(ds.full_state_dict(), fs.full_state_dict())
