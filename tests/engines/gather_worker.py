"""FSDP2's gathered weight push on a world of 1 (in-process) or 2 (under torchrun):

    python -m torch.distributed.run --nproc_per_node=2 -m tests.engines.gather_worker OUT_DIR

Every rank builds the same tiny Qwen2 (an odd vocabulary and intermediate size, so the shards are uneven) as an
FSDP2 engine and trains 3 optimizer steps on the same batches, each rank's loss halved (the engine averages the
ranks' gradients: (g + g) / 2 = g exactly, the same gradient as one process, so the same weights bit for bit).
No clipping: the global norm summed over shards rounds differently from one process's, and its clip factor would
move the last bits (tests/invariants/test_data_parallel.py compares that with a tolerance). Then the push:
`weight_buckets(dst=0)` in buckets of 2 KiB (many buckets; rank 1 joins each gather and keeps nothing) and
`weight_sync.full_state_dict` (every rank keeps). Each rank writes `OUT_DIR/rank<r>_of<world>.pt`; then the same
with a LoRA adapter on the model (`OUT_DIR/lora_rank<r>_of<world>.pt`, the push merged).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

SETTINGS = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01, grad_clip=0.0, warmup_steps=1, micro_batch=2,
                grad_accum=1, bf16=False, zero_stage=0)


def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=51, hidden_size=32, intermediate_size=67, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def run(out_dir: Path) -> dict:
    """The plain model, then the same with a LoRA adapter (its push merged: W + (alpha / r) B A per layer)."""
    return {"plain": run_one(out_dir, lora=False), "lora": run_one(out_dir, lora=True)}


def run_one(out_dir: Path, lora: bool) -> dict:
    import torch.distributed as dist

    from credo.distributed.engine import setup_distributed
    from credo.distributed.engines import make_engine
    from credo.distributed.engines.weights import weight_buckets
    from credo.distributed.weight_sync import full_state_dict

    rank, world = setup_distributed(backend="fsdp2")
    model = tiny_model()
    if lora:
        from credo.config import LoraConfig
        from credo.lora import add_lora

        add_lora(model, LoraConfig(r=4, alpha=8.0), seed=0)
    engine = make_engine("fsdp2", model, **{**SETTINGS, "lr": 3e-2 if lora else 3e-3})
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, 51, (2, 9), generator=g, device="cpu")
        logits = engine.module(input_ids=ids).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()) * 4.0
        engine.backward(loss / world, world)
        engine.step()
    buckets = list(weight_buckets(engine.module, bucket_bytes=2048, dst=0))
    out = {"rank": rank, "world": world, "buckets": [[n for n, _ in b] for b in buckets],
           "dst0": {n: t for b in buckets for n, t in b}, "all": full_state_dict(engine.module),
           "sharded": sorted(n for n, p in engine.module.named_parameters() if hasattr(p, "to_local"))}
    torch.save(out, Path(out_dir) / f"{'lora_' if lora else ''}rank{rank}_of{world}.pt")
    if world > 1:
        dist.barrier()
    return out


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    from credo.distributed.engine import teardown_distributed

    teardown_distributed()
