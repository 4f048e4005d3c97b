"""A Qwen3-shaped model (random init) through credo's trainer: GRPO steps on the arithmetic task, with the update
phase's model FLOP utilisation and the peak device memory.

The model is built here from the published shape (no weights are downloaded: the device machine has no network)
with credo's character tokenizer; the embedding keeps its 151,936 rows, so the lm_head costs what the real model's
does. The run goes through `credo.trainer.Trainer.train_step` (rollout with the hf backend, reward, recompute,
DeepSpeed update), but not `fit`, which would write a DeepSpeed checkpoint and an exported model at the last step
(tens of GB for 4B parameters, minutes of disk time that say nothing about training speed).

MFU of the update = 6 * N * T / t_update / peak, with N every parameter (the tied embedding counted once: its
lm_head matmul is real work, its lookup is not), T the real (unpadded) tokens the update forwards and
backpropagates, t_update the update's wall time (synchronised), peak 989e12 (H100/H200 SXM dense bf16, datasheet);
the same against 788e12, a measured 8192^3 bf16 matmul on this workplace's H200 (KINDS.md). Attention score FLOPs
(sequences of ~150 tokens) and padding are left out, so this under-counts the work done.

Usage (device):  python3 benchmarks/gpu/qwen3_mfu.py --shape 4b --steps 4 --micro-batch 8 --out $OUT/qwen3_4b.json
       (CPU smoke): python3 benchmarks/gpu/qwen3_mfu.py --shape tiny --steps 2 --out /tmp/gpu1/tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

PEAK_BF16_DATASHEET = 989e12
PEAK_BF16_MEASURED = 788e12

# Qwen3's published configs (hub config.json of Qwen/Qwen3-4B and Qwen/Qwen3-0.6B); "tiny" is the CPU smoke test.
SHAPES = {
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               intermediate_size=9728, tie_word_embeddings=True, vocab_size=151936),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072, tie_word_embeddings=True, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, tie_word_embeddings=True, vocab_size=151936),
}


def build_model_dir(shape: str, out: Path, dtype) -> tuple[Path, int]:
    """Save a randomly initialised Qwen3 of `shape` with credo's char tokenizer; return (dir, parameter count)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from credo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    shutil.rmtree(out, ignore_errors=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # initialising 4B weights on the GPU takes seconds
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())  # tied: the embedding is counted once
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out, n_params


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--workdir", default="/tmp/credo_gpu")
    ap.add_argument("--out", required=True, help="JSON file for the results")
    args = ap.parse_args()

    import torch

    import credo.api
    from credo.trainer import Trainer

    cuda = torch.cuda.is_available()
    work = Path(args.workdir) / f"qwen3_{args.shape}"
    result: dict = {"shape": args.shape, "shape_config": SHAPES[args.shape], "dtype": args.dtype, "cuda": cuda,
                    "device_name": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                    "steps": args.steps, "micro_batch_size": args.micro_batch, "prompts_per_step": args.prompts,
                    "group_size": args.group, "max_new_tokens": args.max_new_tokens, "status": "started"}
    out = Path(args.out)

    def save():
        out.write_text(json.dumps(result, indent=2) + "\n")

    t0 = time.perf_counter()
    model_dir, n_params = build_model_dir(args.shape, work / "model", getattr(torch, args.dtype))
    result.update(n_params=n_params, build_model_s=round(time.perf_counter() - t0, 2))
    print(f"[qwen3_mfu] built {args.shape}: {n_params / 1e9:.3f} B parameters in {result['build_model_s']} s",
          flush=True)
    save()

    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = {
        "run.name": f"qwen3_{args.shape}_mfu", "run.output_dir": str(run_dir), "run.steps": args.steps,
        "run.eval_every": 0, "run.save_every": 0, "run.plot": False, "run.progress": False,
        "model.path": str(model_dir), "model.dtype": args.dtype,
        "sft.enabled": False,
        "rollout.backend": "hf", "rollout.prompts_per_step": args.prompts, "rollout.group_size": args.group,
        "rollout.max_new_tokens": args.max_new_tokens,
        "algo.advantage": "grpo", "algo.policy_loss": "ppo", "algo.micro_batch_size": args.micro_batch,
        "optim.lr": 1e-6, "optim.warmup_steps": 0, "optim.zero_stage": 1,
    }
    recipe = credo.api.load(str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"), overrides)
    t0 = time.perf_counter()
    trainer = Trainer(recipe)
    result["trainer_build_s"] = round(time.perf_counter() - t0, 2)
    print(f"[qwen3_mfu] trainer built in {result['trainer_build_s']} s", flush=True)

    # Time the update ourselves, synchronised, and count the tokens it trains on.
    updates: list[dict] = []
    inner = trainer.updater.update

    def timed_update(batch):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        res = inner(batch)
        if cuda:
            torch.cuda.synchronize()
        am = batch.attention_mask
        updates.append({"t_update_s": time.perf_counter() - start, "real_tokens": int(am.sum()),
                        "padded_tokens": int(am.numel()), "rows": int(am.shape[0]), "width": int(am.shape[1]),
                        "loss_tokens": int(batch.loss_mask.sum()),
                        "update_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None})
        return res

    trainer.updater.update = timed_update
    rows = []
    try:
        for step in range(1, args.steps + 1):
            row = trainer.train_step(step)
            trainer.tracker.log(row)
            u = updates[-1] if updates else {}
            flops = 6 * n_params * u.get("real_tokens", 0)
            t_upd = u.get("t_update_s") or float("nan")
            u.update(step=step, update_tflops=flops / t_upd / 1e12,
                     mfu_datasheet=flops / t_upd / PEAK_BF16_DATASHEET,
                     mfu_measured_matmul=flops / t_upd / PEAK_BF16_MEASURED,
                     **{k: row[k] for k in ("perf/rollout_s", "perf/logprob_s", "perf/update_s", "perf/step_time_s",
                                            "perf/tokens_per_s", "perf/peak_rss_gb", "train/response_len",
                                            "train/truncated_frac", "train/reward_mean", "train/loss") if k in row})
            rows.append(u)
            result["per_step"] = rows
            if cuda:
                result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
                result["max_memory_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            save()
            print(f"[qwen3_mfu] step {step}: " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                                             for k, v in u.items()}), flush=True)
    finally:
        trainer.tracker.close()
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            shutil.copy(metrics, out.with_suffix(".metrics.jsonl"))

    # Step 1 carries the start-up (cuBLAS handles, allocator growth, kernel selection): leave it out when we can.
    steady = rows[1:] or rows
    med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
    result.update(
        status="ok",
        steady_steps=[r["step"] for r in steady],
        median_update_s=med("t_update_s"), median_real_tokens=med("real_tokens"),
        median_update_tflops=med("update_tflops"),
        median_mfu_datasheet=med("mfu_datasheet"), median_mfu_measured_matmul=med("mfu_measured_matmul"),
        median_step_time_s=med("perf/step_time_s"), median_rollout_s=med("perf/rollout_s"),
        mfu_formula="6 * n_params * real_tokens / t_update / peak; peak 989e12 (datasheet dense bf16) and 788e12 "
                    "(measured 8192^3 bf16 matmul, KINDS.md); attention-score FLOPs and padding not counted",
    )
    save()
    print(f"[qwen3_mfu] {args.shape}: median update {result['median_update_s']:.3f} s for "
          f"{result['median_real_tokens']} tokens = {result['median_update_tflops']:.1f} TFLOP/s, MFU "
          f"{result['median_mfu_datasheet']:.3f} (989) / {result['median_mfu_measured_matmul']:.3f} (788); "
          f"peak allocated {result.get('max_memory_allocated_gib')} GiB", flush=True)
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
