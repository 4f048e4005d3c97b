"""The cost of a weight push under each training engine: gather (FSDP2's DTensor blocks, bucket by bucket) plus
the copy into the rollout side, for the quickstart's model in one process.

    python benchmarks/weight_push.py --repeats 20 --out push.json
    python benchmarks/weight_push.py --repeats 3 --vllm        # also the in-place push into a vLLM engine

Per engine (built as the trainer builds it, `make_engine`), the median seconds over `--repeats` of:
- `state`: `weight_sync.full_state_dict(engine.module)`, the state dict the vLLM and Ray pushes send (DeepSpeed
  ZeRO-1: views of the live tensors, no copy; FSDP2: gathered CPU copies);
- `copy`: `RolloutCopy.sync_from` of a bf16 copy with FP8 linears (the MIPU recipe's hf rollout copy);
- `buffer`: `WeightBuffers.publish` (overlap's shared-memory double buffer);
- `vllm` (with --vllm): `push_weights` into a vLLM engine built from the model folder (serialise, send, reload).
The engines alternate repeat by repeat. Figures on a loaded machine are not publishable: re-measure quietly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("deepspeed", "fsdp2")


def build(backend: str, model_dir: Path, r):
    from transformers import AutoModelForCausalLM

    from credo.distributed.engines import make_engine

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    o = r.optim
    return make_engine(backend, model, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                       warmup_steps=o.warmup_steps, grad_accum=1, bf16=False, micro_batch=8,
                       zero_stage=r.engine.zero_stage)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--vllm", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import torch

    from credo.config import load_recipe
    from credo.distributed.engine import setup_distributed
    from credo.distributed.rollout_copy import RolloutCopy
    from credo.distributed.weight_buffer import WeightBuffers
    from credo.distributed.weight_sync import full_state_dict, push_weights
    from credo.models import build_tiny_model

    r = load_recipe(REPO / "recipes" / "quickstart.yaml")
    model_dir = build_tiny_model(r.model.tiny)
    setup_distributed()
    engines = {b: build(b, model_dir, r) for b in ENGINES}
    ctx = torch.multiprocessing.get_context("spawn")
    sides = {b: {"copy": RolloutCopy(e.module, dtype="bfloat16", fp8_weights=True),
                 "buffer": WeightBuffers(e.module, ctx)} for b, e in engines.items()}
    llm = None
    if a.vllm:
        from credo.distributed.vllm_backend import VLLMBackend

        llm = VLLMBackend(str(model_dir), dtype="float32", seed=0, enforce_eager=True)
    times = {b: {k: [] for k in ("state", "copy", "buffer", *(["vllm"] if a.vllm else []))} for b in ENGINES}
    for i in range(a.repeats):
        for b, e in engines.items():
            t = times[b]
            t["state"].append(timed(lambda: full_state_dict(e.module)))
            t["copy"].append(timed(lambda: sides[b]["copy"].sync_from(e.module)))
            t["buffer"].append(timed(lambda: sides[b]["buffer"].publish(e.module, i, timeout_s=60)))
            if llm is not None:
                t["vllm"].append(push_weights(llm.llm, e.module))
    n = sum(p.numel() for p in engines["deepspeed"].module.parameters())
    result = {"model_params": n, "repeats": a.repeats,
              "median_s": {b: {k: statistics.median(v) for k, v in t.items()} for b, t in times.items()}}
    print(f"quickstart model, {n / 1e6:.2f}M parameters, median of {a.repeats}:")
    print("| push | " + " | ".join(f"{b} s" for b in ENGINES) + " |\n|---|---|---|")
    for k in times["deepspeed"]:
        print(f"| {k} | " + " | ".join(f"{result['median_s'][b][k]:.5f}" for b in ENGINES) + " |")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    if llm is not None:
        llm.close()


if __name__ == "__main__":
    main()
