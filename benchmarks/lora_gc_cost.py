"""Memory and time of LoRA (model.lora) and gradient checkpointing (model.gradient_checkpointing) against full
fine-tuning, as ratios to the full fine-tuning baseline measured in the same run.

Two parts:

1. `update` (default): one policy update step, as the trainer takes it, on a mid-size Qwen2 built from a config
   (hidden 512, 8 layers, vocabulary 32,000: 55M parameters, fp32): the scorer's hidden-state forward
   (`credo.train.scoring.policy_forward`, chunked log-probs and entropy), a PPO-style token loss, backward, and an
   AdamW step over the trainable parameters (the optimizer's moments are created in a warm-up step first, as in
   every step but a run's first). Variants: full, lora (r 16, all linear layers), gc (checkpointing on), lora+gc.
   Memory: each variant runs in a fresh subprocess that builds its model and optimizer, takes one warm-up step,
   resets the kernel's peak-RSS counter (/proc/self/clear_refs, as benchmarks/logprob_memory.py does), takes
   one step and reports VmHWM minus the RSS before it: what a step needs on top of the model, its gradients
   and the optimizer state (those are reported separately, as `state MiB`: parameters + optimizer moments
   + gradient buffers the step leaves, measured as the RSS after the warm-up step minus the RSS before the
   model was built). Time: one subprocess holds all four variants and runs `--rounds` rounds, each timing
   one step of every variant in an order rotated per round; the minimum per variant is kept. With `--rounds 0`
   (a loaded machine) the time is that of each memory process's measured step: CPU seconds are the figure to
   read then, as the four processes run side by side.
2. `quickstart`: recipes/quickstart.yaml run as written (full fine-tuning), with LoRA (`--lora-overrides`) and
   with gradient checkpointing, one after the other (warm-up cached and shared): eval/accuracy at every
   evaluation, the median step and update time and the peak RSS from metrics.jsonl.

Usage:
    nice -n 10 .venv/bin/python benchmarks/lora_gc_cost.py update --batch 8 --length 512 --rounds 3
    nice -n 10 .venv/bin/python benchmarks/lora_gc_cost.py quickstart --out /tmp/lora-bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

VARIANTS = ("full", "lora", "gc", "lora+gc")
SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=32000, max_position_embeddings=1024, tie_word_embeddings=False)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def build(variant: str, lora_r: int):
    """The model (and its optimizer over the trainable parameters) of one variant, seeded the same way."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from credo.config import LoraConfig
    from credo.lora import add_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE), dtype=torch.float32)
    if "lora" in variant:
        add_lora(model, LoraConfig(r=lora_r, alpha=2.0 * lora_r))
    if "gc" in variant:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # the updater's mode with checkpointing on
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    return model, optimizer


def inputs(batch: int, length: int):
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=gen)
    mask = torch.zeros(batch, length - 1, dtype=torch.bool)
    mask[:, length // 4:] = True  # the response: the last three quarters
    adv = torch.randn(batch, length - 1, generator=gen)
    return ids, torch.ones_like(ids), mask, adv


def step(model, optimizer, ids, attn, mask, adv) -> None:
    """One update step on the trainer's scoring path: hidden-state log-probs and entropy, token loss, AdamW."""
    from credo.train.scoring import policy_forward

    lp, ent = policy_forward(model, ids, attn, mask, temperature=1.0, chunk_size=1024, with_entropy=True)
    ratio = (lp - lp.detach()).exp()
    loss = (-(ratio * adv) - 0.001 * ent)[mask].sum() / mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure_memory(variant: str, batch: int, length: int, lora_r: int) -> dict:
    import torch

    torch.set_num_threads(2)
    before_model = _rss_kib("VmRSS")
    model, optimizer = build(variant, lora_r)
    data = inputs(batch, length)
    step(model, optimizer, *data)  # warm-up: the optimizer's moments exist from here on
    base = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0, c0 = time.perf_counter(), time.process_time()
    step(model, optimizer, *data)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _rss_kib("VmHWM")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"variant": variant, "step_mib": (peak - base) / 1024, "state_mib": (base - before_model) / 1024,
            "trainable": trainable, "params": sum(p.numel() for p in model.parameters()), "wall_s": wall,
            "cpu_s": cpu}


def measure_time(batch: int, length: int, rounds: int, lora_r: int) -> dict:
    import torch

    torch.set_num_threads(2)
    built = {v: build(v, lora_r) for v in VARIANTS}
    data = inputs(batch, length)
    for v in VARIANTS:
        step(*built[v], *data)
    wall = {v: [] for v in VARIANTS}
    cpu = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            t0, c0 = time.perf_counter(), time.process_time()
            step(*built[v], *data)
            wall[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
    return {v: {"wall_s": min(wall[v]), "cpu_s": min(cpu[v])} for v in VARIANTS}


def _children(arg_lists: list[list[str]]) -> list[dict]:
    """Run one subprocess per argument list, all at once (each measures only itself), and read their JSON."""
    procs = [subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO) for args in arg_lists]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(err[-3000:])
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def update_table(a) -> None:
    common = ["--batch", str(a.batch), "--length", str(a.length), "--lora-r", str(a.lora_r)]
    mem = dict(zip(VARIANTS, _children([["_memory", v, *common] for v in VARIANTS])))
    print(json.dumps(mem), flush=True)  # the memory part, before the (longer) timing part
    # --rounds 0: the time of each memory process's measured step (one step, the four processes side by side)
    times = _children([["_time", "--rounds", str(a.rounds), *common]])[0] if a.rounds else mem
    print(f"update step: Qwen2 {SHAPE['num_hidden_layers']} layers x {SHAPE['hidden_size']}, vocab "
          f"{SHAPE['vocab_size']}, {mem['full']['params'] / 1e6:.1f}M parameters, fp32; batch {a.batch} x "
          f"{a.length} tokens, LoRA r {a.lora_r}; " + (f"{a.rounds} rounds" if a.rounds else "time: the memory step"))
    print("| variant | trainable | state MiB | state vs full | step peak MiB | step vs full | wall s | wall vs full "
          "| CPU s | CPU vs full |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    f_mem, f_t = mem["full"], times["full"]
    for v in VARIANTS:
        m, t = mem[v], times[v]
        print(f"| {v} | {m['trainable'] / 1e6:.2f}M | {m['state_mib']:.0f} | {m['state_mib'] / f_mem['state_mib']:.3f} "
              f"| {m['step_mib']:.0f} | {m['step_mib'] / f_mem['step_mib']:.3f} | {t['wall_s']:.2f} | "
              f"{t['wall_s'] / f_t['wall_s']:.3f} | {t['cpu_s']:.2f} | {t['cpu_s'] / f_t['cpu_s']:.3f} |")


def quickstart_table(a) -> None:
    runs = {"full": [], "lora": a.lora_overrides, "gc": ["model.gradient_checkpointing=true"]}
    results = {}
    for name, extra in runs.items():
        out = Path(a.out) / name
        if not (out / "metrics.jsonl").exists():
            cmd = [sys.executable, "-m", "credo.cli", "run", "recipes/quickstart.yaml", f"run.output_dir={out}",
                   "run.progress=false", "run.plot=false", *a.quickstart_overrides, *extra]
            done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        train = [r for r in rows if "perf/step_time_s" in r]
        results[name] = {
            "eval": {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r},
            "step_s": statistics.median(r["perf/step_time_s"] for r in train),
            "update_s": statistics.median(r["perf/update_s"] for r in train),
            "rss_gb": max(r["perf/peak_rss_gb"] for r in train)}
    full = results["full"]
    steps = sorted(full["eval"])
    print("quickstart: " + " ".join(a.quickstart_overrides) + f"; lora: {' '.join(a.lora_overrides)}")
    print("| run | " + " | ".join(f"eval@{s}" for s in steps) + " | median step s | vs full | median update s | "
          "vs full | peak RSS GB | vs full |")
    print("|---|" + "---|" * (len(steps) + 6))
    for name, res in results.items():
        print(f"| {name} | " + " | ".join(f"{res['eval'].get(s, float('nan')):.3f}" for s in steps) +
              f" | {res['step_s']:.3f} | {res['step_s'] / full['step_s']:.3f} | {res['update_s']:.3f} | "
              f"{res['update_s'] / full['update_s']:.3f} | {res['rss_gb']:.2f} | "
              f"{res['rss_gb'] / full['rss_gb']:.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["update", "quickstart", "_memory", "_time"])
    p.add_argument("variant", nargs="?", choices=VARIANTS)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--out", default="/tmp/credo-lora-bench", help="quickstart: the runs' parent folder (reused)")
    p.add_argument("--quickstart-overrides", nargs="*", default=[], help="quickstart: overrides of every run")
    p.add_argument("--lora-overrides", nargs="*", help="quickstart: the LoRA run's overrides",
                   default=["model.lora.r=16", "model.lora.alpha=32", "optim.lr=3e-3"])
    a = p.parse_args()
    if a.part == "_memory":
        print(json.dumps(measure_memory(a.variant, a.batch, a.length, a.lora_r)))
    elif a.part == "_time":
        print(json.dumps(measure_time(a.batch, a.length, a.rounds, a.lora_r)))
    elif a.part == "update":
        update_table(a)
    else:
        quickstart_table(a)


if __name__ == "__main__":
    main()
