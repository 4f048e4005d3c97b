"""Peak memory and time of dense vs streaming attention credit (arXiv 2510.13554, 2606.10646).

Two tasks on one layer of ``H = 16`` heads, head dim 64 (fp32 CPU tensors), N in {1024, 4096}:

- ``head stats``: per-head span, WAAD and FAI. Dense = ``attention_from_qk`` (all H maps) then
  ``head_span`` / ``waad`` / ``fai`` per head; streaming = ``streaming_head_stats``.
- ``flow``: FlowTracer throughput of the head-averaged map. Dense = ``attention_from_qk`` then
  ``flow_throughput``; streaming = ``streaming_flow_throughput`` (no N x N matrix at all).

How memory is measured (CPU): every (task, path, N) case runs in a fresh Python subprocess with
one thread. The subprocess allocates the inputs (q, k, masks) and runs the same path once on a
tiny N = 64 problem (so lazily loaded kernels are not charged to the case), then resets the
kernel's peak-RSS counter by writing "5" to /proc/self/clear_refs (Linux >= 4.0; VmHWM becomes
the current RSS) and records the current RSS as the baseline. After one run of the case the peak is
VmHWM from /proc/self/status; the reported number is VmHWM - baseline, the physical memory the
computation needed on top of its inputs, whichever allocator made it. (ru_maxrss cannot be reset,
and torch's CPU allocator keeps no peak statistics; it returns large blocks to the OS on free, so
RSS follows live tensors.) A "baseline" row runs the same subprocess with an empty case: its
number is the measurement's noise floor. With ``--device cuda`` the peak is
``torch.cuda.max_memory_allocated`` after a reset, minus the allocated bytes before the run.

Time: wall time of that single run (time.perf_counter), single-threaded; the machine may be
shared, so compare the ratios of one run rather than absolute numbers.

Usage:
    nice -n 10 .venv/bin/python benchmarks/attention_credit.py [--sizes 1024 4096] [--block-size 256]
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

HEADS = 16
HEAD_DIM = 64


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _inputs(n, device):
    import torch

    g = torch.Generator().manual_seed(n)
    q = torch.randn(HEADS, n, HEAD_DIM, generator=g).to(device)
    k = torch.randn(HEADS, n, HEAD_DIM, generator=g).to(device)
    t = torch.arange(n, device=device)
    response = t >= n // 4
    question = (t >= 16) & (t < n // 4)
    answer = (t >= n - 40) & (t < n - 8)
    return q, k, response, question, answer


def _run(task, path, inputs, block_size):
    import torch

    from credo.credit import (
        attention_from_qk,
        fai,
        flow_throughput,
        head_span,
        streaming_flow_throughput,
        streaming_head_stats,
        waad,
    )

    q, k, response, question, answer = inputs
    if path == "baseline":
        return None
    if task == "head stats":
        if path == "dense":
            maps = attention_from_qk(q, k)
            span, _, _ = head_span(maps, response)
            waad_h = torch.stack([waad(a, 10) for a in maps])
            fai_h = torch.stack([fai(a, response, 10, 100) for a in maps])
            return span, waad_h, fai_h
        return streaming_head_stats(q, k, response_mask=response, block_size=block_size)
    if path == "dense":
        return flow_throughput(attention_from_qk(q, k), question, answer)
    return streaming_flow_throughput(q, k, question, answer, block_size=block_size)


def worker(task, path, n, block_size, device):
    import torch

    torch.set_num_threads(1)
    inputs = _inputs(n, device)
    _run(task, path, _inputs(64, device), min(block_size, 32))  # warm-up, not measured
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _rss_kib("VmRSS") * 1024
    start = time.perf_counter()
    _run(task, path, inputs, block_size)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _rss_kib("VmHWM") * 1024 - before
    print(json.dumps({"peak_bytes": peak, "seconds": seconds}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--worker", nargs=3, metavar=("TASK", "PATH", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        task, path, n = args.worker
        worker(task.replace("_", " "), path, int(n), args.block_size, args.device)
        return

    print(f"H={HEADS} heads, head dim {HEAD_DIM}, fp32, device {args.device}, block {args.block_size}")
    header = f"{'task':<11} {'N':>5} {'path':<10} {'peak MiB':>9} {'time s':>8} {'peak / dense':>13}"
    print(header)
    print("-" * len(header))
    failures = []
    for n in args.sizes:
        for task in ("head stats", "flow"):
            results = {}
            for path in ("baseline", "dense", "streaming"):
                if task == "flow" and path == "baseline":
                    continue
                cmd = [sys.executable, __file__, "--worker", task.replace(" ", "_"), path, str(n)]
                cmd += ["--block-size", str(args.block_size), "--device", args.device]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                results[path] = json.loads(out.stdout.strip().splitlines()[-1])
            dense = results["dense"]["peak_bytes"]
            for path, r in results.items():
                ratio = r["peak_bytes"] / dense if path != "baseline" else float("nan")
                print(
                    f"{task:<11} {n:>5} {path:<10} {r['peak_bytes'] / 2**20:>9.1f} "
                    f"{r['seconds']:>8.2f} {ratio:>13.3f}"
                )
            if n == 4096 and results["streaming"]["peak_bytes"] > 0.1 * dense:
                failures.append(f"{task} at N=4096: streaming peak above 0.1 x dense")
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
