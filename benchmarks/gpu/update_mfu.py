"""The update phase of a Qwen3-shaped model (random init) under each training engine: tokens/s, MFU, peak memory.

One micro-batch of packed sequences (`--tokens` in all, `--seq-len` each, no padding) goes through credo's own
update path: `credo.train.scoring.policy_forward(packed=True)` (one packed forward, the hidden-state log-prob
kernel), a token-mean loss, `engine.backward`, `engine.step` (clip + AdamW), for `--steps` steps per engine; the
first step is left out of the medians (allocator growth, kernel selection). The engines alternate in one process:
deepspeed (ZeRO-1, torch AdamW) and fsdp2 (per-block fully_shard, bf16 compute over fp32 master weights).

MFU = F / t_step / peak, with the model FLOPs of one step (PaLM's count, arXiv 2204.02311, appendix B)
    F = tokens * (6 * N + 12 * n_layers * n_heads * head_dim * seq_len)
N every parameter but the input embedding's lookup (a tied head counts once, as the lm_head matmul); the second
term is the attention scores and their weighted sum (QK^T and AV, forward and backward), counted for the whole
seq_len x seq_len square as PaLM does (a causal kernel does about half). The peak is 989e12 (H100/H200 SXM dense
bf16, datasheet); on CPU (`CREDO_GPU_TINY=1`) no MFU is given.

    python benchmarks/gpu/update_mfu.py --shape 0.6b --tokens 16384 --steps 4 --out /tmp/mfu.json    # GPU
    CREDO_GPU_TINY=1 python benchmarks/gpu/update_mfu.py --out /tmp/mfu_tiny.json                     # CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.qwen3_mfu import SHAPES  # noqa: E402  (the published Qwen3 shapes)

PEAK_BF16 = 989e12


def step_flops(shape: dict, n_params: int, tokens: int, seq_len: int) -> float:
    """Model FLOPs of one training step on `tokens` tokens in sequences of `seq_len` (see the module doc)."""
    attn = 12 * shape["num_hidden_layers"] * shape["num_attention_heads"] * shape["head_dim"] * seq_len
    return tokens * (6 * n_params + attn)


def build_model(shape_name: str, dtype, vocab_size: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    shape = {**SHAPES[shape_name], **({"vocab_size": vocab_size} if vocab_size else {})}
    config = Qwen3Config(**shape, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters()) - (0 if shape["tie_word_embeddings"] else emb.numel())
    return model, n


def run_engine(backend: str, args, dtype) -> dict:
    import torch

    from credo.distributed.engines import make_engine
    from credo.train.scoring import policy_forward

    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    model, n_params = build_model(args.shape, dtype, args.vocab_size)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine = make_engine(backend, model, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=1.0,
                         warmup_steps=0, micro_batch=1, grad_accum=1, bf16=dtype == torch.bfloat16, zero_stage=1)
    start_s = time.perf_counter() - t0
    dev = next(engine.module.parameters()).device
    rows, L = args.tokens // args.seq_len, args.seq_len
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, args.vocab_size or SHAPES[args.shape]["vocab_size"], (rows, L), generator=g,
                        device="cpu").to(dev)
    attn = torch.ones(rows, L, dtype=torch.long, device=dev)
    mask = torch.ones(rows, L - 1, dtype=torch.bool, device=dev)
    engine.module.train()
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        lp, _ = policy_forward(engine.module, ids, attn, mask, temperature=1.0, chunk_size=1024, with_entropy=False,
                               hidden_path=True, packed=True)
        loss = -(lp * mask).sum() / mask.sum()
        engine.backward(loss, 1)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    steady = times[1:] or times
    t_step = statistics.median(steady)
    flops = step_flops(SHAPES[args.shape], n_params, rows * L, L)
    out = {"backend": backend, "n_params": n_params, "tokens": rows * L, "seq_len": L, "start_s": round(start_s, 3),
           "step_s": [round(x, 4) for x in times], "median_step_s": t_step,
           "tokens_per_s": rows * L / t_step, "model_tflops_per_s": flops / t_step / 1e12,
           "mfu": flops / t_step / PEAK_BF16 if cuda else None,
           "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    del engine, model
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> int:
    tiny = os.environ.get("CREDO_GPU_TINY") == "1"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny" if tiny else "0.6b")
    ap.add_argument("--tokens", type=int, default=256 if tiny else 16384)
    ap.add_argument("--seq-len", type=int, default=64 if tiny else 1024)
    ap.add_argument("--steps", type=int, default=2 if tiny else 4)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32" if tiny else "bfloat16")
    ap.add_argument("--engines", nargs="+", default=["deepspeed", "fsdp2"])
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--vocab-size", type=int, default=None, help="instead of the shape's 151,936 (CI's quick run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.tokens % args.seq_len:
        ap.error("--tokens must be a multiple of --seq-len")

    import torch

    from credo.distributed.engine import setup_distributed

    setup_distributed(backend="fsdp2" if args.engines == ["fsdp2"] else "deepspeed")
    res = {"shape": args.shape, "dtype": args.dtype, "tokens": args.tokens, "seq_len": args.seq_len,
           "steps": args.steps, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "peak_flops": PEAK_BF16, "flops_formula": "tokens * (6 N + 12 n_layers n_heads "
           "head_dim seq_len), PaLM appendix B; N without the input embedding lookup", "engines": {}}
    for backend in args.engines:
        try:
            res["engines"][backend] = run_engine(backend, args, getattr(torch, args.dtype))
        except Exception as e:  # a failure of one engine must not lose the other's figures
            res["engines"][backend] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        print(f"[update_mfu] {backend}: " + json.dumps(res["engines"][backend]), flush=True)
    return 0 if all("error" not in v for v in res["engines"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
