"""Issue 53: a weight push from DeepSpeed ZeRO-3 gathers the partitioned parameters bucket by bucket, never the whole
model at once on one rank. The buckets must hold exactly what the whole gather gives (names, order, tied aliases once,
bits), and no gather may hold more than one bucket's parameters."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.engine import setup_distributed
from credo.distributed.engines import make_engine

SETTINGS = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01, grad_clip=0.5, warmup_steps=1, micro_batch=2,
                grad_accum=1, bf16=False, zero_stage=3)


def tiny_model(tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg)


@pytest.fixture(scope="module")
def world():
    return setup_distributed()


def trained_zero3_engine(tied: bool):
    engine = make_engine("deepspeed", tiny_model(tied), **SETTINGS)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # trained, so the pushed values are not the initial ones
        ids = torch.randint(0, 48, (2, 9), generator=g)
        logits = engine.module(input_ids=ids).logits[:, :-1].float()
        engine.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()), 1)
        engine.step()
    return engine


@pytest.mark.parametrize("tied", [False, True])
def test_zero3_buckets_hold_the_whole_gather_and_gather_one_bucket_at_a_time(world, monkeypatch, tied):
    import deepspeed

    from credo.distributed.engines.weights import weight_buckets
    from credo.distributed.weight_sync import full_state_dict, is_zero3

    engine = trained_zero3_engine(tied)
    assert is_zero3(engine.module)
    whole = full_state_dict(engine.module)  # the gather of every parameter at once (the old push)
    total = sum(t.numel() * t.element_size() for t in whole.values())
    assert ("lm_head.weight" in whole) is not tied  # a tied alias once

    gathered: list[int] = []  # elements of every GatheredParameters call the push makes
    real = deepspeed.zero.GatheredParameters

    def counting(params, *args, **kwargs):
        gathered.append(sum(p.ds_numel for p in params))
        return real(params, *args, **kwargs)

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", counting)
    bucket_bytes = 8 << 10
    for buckets in (list(weight_buckets(engine.module, bucket_bytes=bucket_bytes)),
                    list(engine.weight_buckets(bucket_bytes=bucket_bytes))):  # the module's push and the engine's
        got = [(n, t) for b in buckets for n, t in b]
        assert [n for n, _ in got] == list(whole)  # the same names, in the same order
        for n, t in got:
            assert t.device.type == "cpu" and t.shape == whole[n].shape and torch.equal(t, whole[n]), n
        assert len(buckets) > 3 and all(buckets)
        largest = max(t.numel() * t.element_size() for t in whole.values())
        assert max(sum(t.numel() * t.element_size() for _, t in b) for b in buckets) < bucket_bytes + largest
    assert len(gathered) > 6
    # no gather holds the model: each at most one bucket (closed once it holds bucket_bytes) of fp32 elements
    assert max(gathered) * 4 < bucket_bytes + largest < total, (gathered, total)
    # the parameters are partitioned again after the push (the gathers were released)
    assert all(p.ds_status.name == "NOT_AVAILABLE" for p in engine.module.parameters())


def test_zero3_one_bucket_is_the_whole_gather(world):
    from credo.distributed.weight_sync import full_state_dict, zero3_buckets

    engine = trained_zero3_engine(tied=False)
    whole = full_state_dict(engine.module)
    (bucket,) = list(zero3_buckets(engine.module, 0))
    assert [n for n, _ in bucket] == list(whole) and all(torch.equal(t, whole[n]) for n, t in bucket)
