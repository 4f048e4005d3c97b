"""Peak memory of the trained attention-credit path at N = 4096 against dense [L, H, N, N] maps.

The trained path (arXiv 2510.13554, 2606.10646) is what the `attention_credit` probe runs: hooks on
the sampled layers of a Qwen2 capture post-RoPE q/k during one sdpa forward (`capture_qk`), then
`rhythm_gamma_from_qk` (coupled) or `flow_gamma_from_qk` reduces them in blocks (credo.credit.batched).
The dense alternative runs the same forward and capture, builds the sampled layers' maps
``[L, H, N, N]`` with `attention_from_qk` (the cheapest dense variant: only the sampled layers, not
``output_attentions=True`` over every layer), and applies `attention_rhythm_gamma` /
`flow_throughput` + `flow_gamma`. A `forward` row runs the forward alone (no hooks): subtract it to get
what credit adds.

Model: a random Qwen2 with 16 query heads of dim 64 over 4 KV heads (GQA), hidden 1024, 4 decoder
layers (default sampled layers: the middle third, layers 1 and 2), vocab 1000, fp32; one sequence of
N tokens, the last 3/4 the response, the last 8 the answer.

How memory is measured (CPU, the default): each case runs in a fresh Python subprocess with one
thread. It builds the model and inputs, runs the case once at N = 64 (lazily loaded kernels are not
charged), resets the kernel's peak-RSS counter (writes "5" to /proc/self/clear_refs: VmHWM becomes
the current RSS), runs the case once, and reports VmHWM minus the RSS before the run: the physical
memory the case needed on top of the model and inputs. With ``--device cuda`` it is
``torch.cuda.max_memory_allocated`` after a reset minus the bytes allocated before the run.

Usage:
    nice -n 10 .venv/bin/python benchmarks/attention_capture_memory.py [--n 4096] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 16, 4, 64, 4
CASES = ("forward", "rhythm capture", "rhythm dense", "flow capture", "flow dense")


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _model(device: str):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=HEADS * HEAD_DIM, intermediate_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, num_hidden_layers=LAYERS, vocab_size=1000, max_position_embeddings=8192,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device).eval()


def _inputs(n: int, device: str):
    import torch

    g = torch.Generator().manual_seed(n)
    ids = torch.randint(1, 1000, (1, n), generator=g).to(device)
    mask = torch.ones(1, n, dtype=torch.long, device=device)
    t = torch.arange(n, device=device)[None]
    return ids, mask, t >= n // 4, t >= n - 8


def _run(case: str, model, inputs, block_size: int):
    import torch

    from credo.credit import (
        attention_from_qk,
        attention_rhythm_gamma,
        capture_qk,
        flow_gamma,
        flow_gamma_from_qk,
        flow_throughput,
        rhythm_gamma_from_qk,
    )

    ids, mask, response, answer = inputs
    with torch.no_grad():
        if case == "forward":
            model.model(input_ids=ids, attention_mask=mask)
            return
        with capture_qk(model) as cap:
            model.model(input_ids=ids, attention_mask=mask)
        if case == "rhythm capture":
            rhythm_gamma_from_qk(cap, mask, response, strategy="coupled", block_size=block_size)
        elif case == "flow capture":
            flow_gamma_from_qk(cap, mask, response, answer, block_size=block_size)
        else:
            q, k = cap.stacked()  # [L, 1, H, N, d]
            maps = attention_from_qk(q[:, 0], k[:, 0], scale=cap.scale)  # [L, H, N, N]
            del q, k, cap
            if case == "rhythm dense":
                attention_rhythm_gamma(maps, response[0], strategy="coupled")
            else:
                flow_gamma(flow_throughput(maps, ~response[0], answer[0]), response_mask=response[0])


def worker(case: str, n: int, block_size: int, device: str) -> None:
    import torch

    torch.set_num_threads(1)
    model = _model(device)
    _run(case, model, _inputs(64, device), 32)  # warm-up, not measured
    inputs = _inputs(n, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _rss_kib("VmRSS") * 1024
    start = time.perf_counter()
    _run(case, model, inputs, block_size)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _rss_kib("VmHWM") * 1024 - before
    print(json.dumps({"peak_bytes": peak, "seconds": time.perf_counter() - start}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--worker", metavar="CASE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.n, args.block_size, args.device)
        return
    print(f"Qwen2: {LAYERS} layers, {HEADS} heads x {HEAD_DIM} (KV {KV_HEADS}), fp32, N={args.n}, "
          f"block {args.block_size}, device {args.device}, sampled layers 1, 2")
    results = {}
    for case in args.cases:
        cmd = [sys.executable, __file__, "--worker", case, "--n", str(args.n), "--block-size", str(args.block_size),
               "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{case:<15} peak {results[case]['peak_bytes'] / 2**20:9.1f} MiB  {results[case]['seconds']:7.2f} s",
              flush=True)
    fwd = results.get("forward", {}).get("peak_bytes", 0)
    for kind in ("rhythm", "flow"):
        cap, dense = results.get(f"{kind} capture"), results.get(f"{kind} dense")
        if cap and dense:
            print(f"{kind}: capture / dense peak = {cap['peak_bytes'] / dense['peak_bytes']:.3f}; "
                  f"beyond the forward: {(cap['peak_bytes'] - fwd) / 2**20:.1f} MiB vs "
                  f"{(dense['peak_bytes'] - fwd) / 2**20:.1f} MiB = {(cap['peak_bytes'] - fwd) / (dense['peak_bytes'] - fwd):.3f}")


if __name__ == "__main__":
    main()
