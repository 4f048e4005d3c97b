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
thread. It builds the model and inputs and runs the case once at N = 64 (lazily loaded kernels are
not charged). Then two phases, each measured from a reset of the kernel's peak-RSS counter (writing
"5" to /proc/self/clear_refs makes VmHWM the current RSS) as VmHWM minus the RSS at the reset:
the forward (with the hooks), and the reduction from the captured q/k to gamma (the captured
states are part of the level it starts from; their size is reported apart). With ``--device cuda``
the same with ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the bytes
allocated at the reset.

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


def _forward(case: str, model, inputs):
    """Phase 1, the forward (with the capture hooks unless case is 'forward'); returns the capture or None."""
    import torch

    from credo.credit import capture_qk

    ids, mask, _, _ = inputs
    with torch.no_grad():
        if case == "forward":
            model.model(input_ids=ids, attention_mask=mask)
            return None
        with capture_qk(model) as cap:
            model.model(input_ids=ids, attention_mask=mask)
    return cap


def _reduce(case: str, cap, inputs, block_size: int) -> None:
    """Phase 2, from the captured q/k to gamma: batched streaming (capture) or dense maps."""
    import torch

    from credo.credit import (
        attention_from_qk,
        attention_rhythm_gamma,
        flow_gamma,
        flow_gamma_from_qk,
        flow_throughput,
        rhythm_gamma_from_qk,
    )

    _, mask, response, answer = inputs
    with torch.no_grad():
        if case == "rhythm capture":
            rhythm_gamma_from_qk(cap, mask, response, strategy="coupled", block_size=block_size)
        elif case == "flow capture":
            flow_gamma_from_qk(cap, mask, response, answer, block_size=block_size)
        elif case in ("rhythm dense", "flow dense"):
            q, k = cap.stacked()  # [L, 1, H, N, d]
            maps = attention_from_qk(q[:, 0], k[:, 0], scale=cap.scale)  # [L, H, N, N]
            del q, k
            if case == "rhythm dense":
                attention_rhythm_gamma(maps, response[0], strategy="coupled")
            else:
                flow_gamma(flow_throughput(maps, ~response[0], answer[0]), response_mask=response[0])


class _Peak:
    """Peak memory above the level at `reset()`: VmHWM via /proc/self/clear_refs (CPU) or CUDA statistics."""

    def __init__(self, device: str):
        self.device = device

    def reset(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.before = _rss_kib("VmRSS") * 1024

    def read(self) -> int:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.before
        return _rss_kib("VmHWM") * 1024 - self.before


def worker(case: str, n: int, block_size: int, device: str) -> None:
    import torch

    torch.set_num_threads(1)
    model = _model(device)
    warm = _inputs(64, device)
    _reduce(case, _forward(case, model, warm), warm, 32)  # warm-up, not measured
    inputs = _inputs(n, device)
    peak = _Peak(device)
    start = time.perf_counter()
    peak.reset()
    cap = _forward(case, model, inputs)
    forward_peak = peak.read()
    peak.reset()  # the captured states are now part of the level: phase 2 is what the reduction adds
    mid = time.perf_counter()
    _reduce(case, cap, inputs, block_size)
    reduce_peak = peak.read()
    states = 0 if cap is None else sum(t.numel() * t.element_size() for s in cap.states.values() for t in s.values())
    print(json.dumps({"forward_peak": forward_peak, "reduce_peak": reduce_peak, "states_bytes": states,
                      "forward_s": mid - start, "reduce_s": time.perf_counter() - mid}))


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
    print("| case | forward peak (MiB) | captured q/k (MiB) | reduction peak (MiB) | forward s | reduction s |")
    print("| --- | --- | --- | --- | --- | --- |")
    results = {}
    for case in args.cases:
        cmd = [sys.executable, __file__, "--worker", case, "--n", str(args.n), "--block-size", str(args.block_size),
               "--device", args.device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        r = results[case] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {case} | {r['forward_peak'] / 2**20:.1f} | {r['states_bytes'] / 2**20:.1f} | "
              f"{r['reduce_peak'] / 2**20:.1f} | {r['forward_s']:.2f} | {r['reduce_s']:.2f} |", flush=True)
    for kind in ("rhythm", "flow"):
        cap, dense = results.get(f"{kind} capture"), results.get(f"{kind} dense")
        if cap and dense:
            # what credit adds on top of the forward: the stored states plus the reduction's peak
            extra_cap = cap["states_bytes"] + cap["reduce_peak"]
            extra_dense = dense["states_bytes"] + dense["reduce_peak"]
            print(f"{kind}: reduction peak capture / dense = {cap['reduce_peak'] / dense['reduce_peak']:.3f}; "
                  f"states + reduction: {extra_cap / 2**20:.1f} MiB vs {extra_dense / 2**20:.1f} MiB = "
                  f"{extra_cap / extra_dense:.3f}")


if __name__ == "__main__":
    main()
