"""What `credo check` says about a recipe's warm-ups: for each, whether it is cached (the run reuses it at once) and,
when not, about how long it will take here, so a user knows before `credo run` whether step 1 is seconds or minutes
away.

How the time is estimated (a cost model, not a measurement of this recipe): one warm-up step is a forward and
backward pass over `batch` sequences padded to the longest of the batch, so its work is

    flops/step = batch x T x (6 x (layers x (2h^2 + 2h h_kv + 3h i) + V h) + 6 x layers x T x h)

(the weight matmuls, six flops per weight per token; the output head over the vocabulary V; attention's two T x h
products per layer), with T the padded length, estimated from 256 of the task's training demonstrations (prompt +
answer + EOS in tokens, the mean of the longest of batch-sized draws; with `sft.micro_batch_tokens` the step is the
sum of this over its length-sorted passes, each padded to its own longest). Seconds = steps x (c + flops/step / R):
c is a fixed cost per step (the optimizer step, Python and kernel launches, which on tiny models outweigh the
matmuls) and R this machine's throughput on such steps. Both are fitted to the warm-ups cached here that recorded
their time (`sft.json`'s `steps`, `seconds` and `flops`, written by every credo warm-up), as a robust line through
their seconds per step against flops per step (`cost_model`); with too few of them, `DEFAULT_STEP_S` and
`DEFAULT_FLOPS_PER_S`. The estimate is shown to one significant figure and is good to about a factor of 2: a loaded
machine runs slower, a GPU far faster (the CPU defaults are not meant for GPUs).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

DEFAULT_STEP_S = 0.08
"""Fixed seconds per warm-up step on a 2-core CPU host, and DEFAULT_FLOPS_PER_S its throughput beyond that: the
`cost_model` line (c 0.081 s, R 1.07e11) through five whole warm-ups timed on an idle one (2026-12-07, 2 threads;
the quickstart's 600 steps of 3.5e9 flops in 68 s, the quickest of its 12 cached here (68-296 s by the load), long tail 150 x 1.4e10 in 19 s and 150 x 4.3e10 in 60 s,
shop 400 x 1.3e10 in 81 s and 400 x 2.1e10 in 131 s); against it they take 0.99x, 0.58x, 0.82x, 1.00x and 1.16x its
estimate (the long tail's short passes run faster than their flops say). The flops-only model it replaced (1e10
FLOP/s, from three warm-ups on a loaded host) overestimated the same five 2-11x, and put the quickstart's warm-up at
"30 min" with one loaded sample cached (issue 57's round-4 trial)."""

DEFAULT_FLOPS_PER_S = 1.1e11
"""See DEFAULT_STEP_S."""

MIN_FIT_POINTS = 3
"""Cached warm-ups needed to fit both terms; with fewer, the fixed cost stays the default."""


MAX_HASHED_BYTES = 2 * 2**30
"""A model with more weight bytes than this is not hashed by `credo check` to look its warm-up up in the cache."""


def model_shape(r, base_path: str) -> dict:
    """layers, h, h_kv, i, V of the model at `base_path` (its config.json), or the recipe's tiny config."""
    cfg_file = Path(base_path) / "config.json"
    if cfg_file.is_file():
        c = json.loads(cfg_file.read_text())
        h = c.get("hidden_size", 0)
        heads = c.get("num_attention_heads", 1)
        return {"layers": c.get("num_hidden_layers", 0), "h": h, "h_kv": h * c.get("num_key_value_heads", heads) // heads,
                "i": c.get("intermediate_size", 4 * h), "V": c.get("vocab_size", 0)}
    t = r.model.tiny
    return {"layers": t.num_layers, "h": t.hidden_size, "h_kv": t.hidden_size * t.num_kv_heads // t.num_heads,
            "i": t.intermediate_size, "V": 128}


def flops_per_step(shape: dict, batch: int, tokens: float) -> float:
    """The module docstring's formula: one forward and backward pass over `batch` sequences of `tokens` tokens."""
    L, h, hkv, i, V = shape["layers"], shape["h"], shape["h_kv"], shape["i"], shape["V"]
    weights = L * (2 * h * h + 2 * h * hkv + 3 * h * i) + V * h
    return batch * tokens * (6 * weights + 6 * L * tokens * h)


def demo_lengths(task, encode, seed: int = 0) -> list[int]:
    """Tokens of 256 of the task's training demonstrations (all of them when it has fewer), drawn at random."""
    rng = random.Random(seed)
    return [encode(task.train(rng.randrange(len(task)))) for _ in range(min(len(task), 256))]


def padded_tokens(task, encode, batch: int, seed: int = 0) -> float:
    """The mean, over 16 draws of `batch` demonstrations (from 256 of the task's), of the longest one's tokens."""
    rng = random.Random(seed)
    lengths = [encode(task.train(rng.randrange(len(task)))) for _ in range(min(len(task), 256))]
    draws = [max(rng.choice(lengths) for _ in range(batch)) for _ in range(16)]
    return sum(draws) / len(draws)


def sft_step_flops(shape: dict, lengths: list[int], batch: int, micro_batch_tokens: int = 0, seed: int = 0) -> float:
    """The mean flops of one credo warm-up step over 16 draws of `batch` of `lengths`: one pass over the batch padded to
    its longest, or with `sft.micro_batch_tokens` the passes of credo.sft.micro_batches, each padded to its own."""
    from credo.sft import micro_batches

    rng, total = random.Random(seed + 1), 0.0
    for _ in range(16):
        draw = [rng.choice(lengths) for _ in range(batch)]
        for rows in micro_batches(draw, micro_batch_tokens):
            total += flops_per_step(shape, len(rows), max(draw[i] for i in rows))
    return total / 16


def timed_warmups(cache: Path) -> list[tuple[float, float]]:
    """(flops per step, seconds per step) of every warm-up cached here that recorded its steps, seconds and flops."""
    points = []
    for f in cache.glob("*/*/sft.json") if cache.is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if d.get("seconds") and d.get("flops") and d.get("steps"):
            points.append((d["flops"] / d["steps"], d["seconds"] / d["steps"]))
    return points


def cost_model(cache: Path) -> tuple[float, float, str]:
    """(c seconds per step, R FLOP/s, where they come from) for seconds = steps x c + flops / R.

    With MIN_FIT_POINTS or more timed warm-ups of distinct sizes: Theil-Sen (the median of the pairwise slopes, then
    the median intercept), so that a warm-up timed under another job's load moves the line less than a mean would.
    Otherwise, or when the fit is not a positive cost and throughput: the default fixed cost (at most half the
    quickest step seen) and the median throughput of the rest of each step."""
    points = timed_warmups(cache)
    n = len(points)
    if n >= MIN_FIT_POINTS:
        slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:]
                  if abs(x2 - x1) > 0.1 * max(x1, x2)]
        if slopes and statistics.median(slopes) > 0:
            b = statistics.median(slopes)
            c = statistics.median(y - b * x for x, y in points)
            if c >= 0:
                return c, 1 / b, f"fitted to {n} warm-ups timed here"
    if points:
        c = min(DEFAULT_STEP_S, min(y for _, y in points) / 2)
        return c, statistics.median(x / (y - c) for x, y in points), f"measured on {n} warm-up(s) cached here"
    return DEFAULT_STEP_S, DEFAULT_FLOPS_PER_S, "the defaults of a 2-core CPU host"


def seconds(plan: dict, model: tuple[float, float, str]) -> float:
    """A warm-up plan's estimated seconds under `cost_model`'s (c, R)."""
    c, rate, _ = model
    return plan["steps"] * c + plan["flops"] / rate


def human(seconds: float) -> str:
    """About 40 s, 3 min, 1.5 h: one significant figure."""
    if seconds < 60:
        return f"{float(f'{max(seconds, 1):.1g}'):g} s"
    if seconds < 3600:
        return f"{float(f'{seconds / 60:.1g}'):g} min"
    return f"{float(f'{seconds / 3600:.2g}'):g} h"


def sft_plan(r, base_path: str, task) -> dict | None:
    """credo's own warm-up: {name, steps, batch, flops, cached (bool), folder}; None when it is off."""
    from credo.config import sft_enabled
    from credo.models import cache_root
    from credo.sft import sft_cache_key

    if not sft_enabled(r) or r.sft.steps <= 0:
        return None
    lengths = demo_lengths(task, token_counter(base_path))
    flops = r.sft.steps * sft_step_flops(model_shape(r, base_path), lengths, r.sft.batch_size, r.sft.micro_batch_tokens)
    plan = {"name": "sft", "steps": r.sft.steps, "batch": r.sft.batch_size, "flops": flops}
    weights = sum(p.stat().st_size for p in Path(base_path).glob("*") if p.suffix in (".safetensors", ".bin", ".pt"))
    if weights > MAX_HASHED_BYTES:  # the key hashes every weight file: seconds per GB, which `credo run` spends anyway
        return {**plan, "cached": None, "folder": f"not looked up: the key hashes {weights / 2**30:.0f} GiB of weights"}
    folder = cache_root() / "sft" / sft_cache_key(r, base_path)
    return {**plan, "cached": (folder / "COMPLETE").exists(), "folder": str(folder)}


def token_counter(base_path: str):
    """Tokens of a demonstration (prompt + answer + EOS) under the model's tokenizer."""
    from credo.models import load_tokenizer

    tok = load_tokenizer(base_path)
    return lambda p: len(tok(p.prompt + str(p.answer), add_special_tokens=False)["input_ids"]) + 1


def warmup_notes(r, task, active: tuple = ()) -> list[str]:
    """One `credo check` note per warm-up of the recipe: cached, or its estimated time (see the module docstring).
    `active`: the run plan's active families (`credo.plan.ActiveFamily`), whose `warmup` parts run after credo's."""
    from credo.models import cache_root, resolve_model_path

    base = resolve_model_path(r.model.path, r.model.tiny)
    if not Path(base).is_dir():  # a hub id not downloaded here (credo check may run on a machine without the model)
        return [f"warm-ups of model.path '{r.model.path}': not estimated here (the model is not on this machine)"]
    plans = []
    sft = sft_plan(r, base, task)
    if sft is not None:
        plans.append(sft)
    policy = sft["folder"] if sft is not None and sft["cached"] else (base if sft is None else None)
    for a in active:
        if a.parts.warmup is None:
            continue
        plan = a.parts.warmup_plan(r, task, policy, base) if a.parts.warmup_plan is not None else None
        if plan and sft is not None and sft["cached"] is None:  # its key hashes credo's warm-up, not looked up
            plan = {**plan, "cached": None, "folder": "after credo's warm-up"}
        plans.append(plan or {"name": a.family.name, "unknown": True})
    model = cost_model(cache_root())
    source = model[2]
    notes = []
    for p in plans:
        if p.get("unknown"):
            notes.append(f"warm-up '{p['name']}': runs before step 1 if the family's settings ask for one; its time "
                         "is not estimated here")
        elif p["cached"] is None:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps of {p['batch']}): cached or not is known at "
                         f"start-up ({p['folder']}); if not, about {human(seconds(p, model))} before step 1 "
                         f"(estimated: steps x a per-step cost model, {source}; docs/getting-started.md)")
        elif p["cached"]:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps): cached ({p['folder']}), reused at once")
        else:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps of {p['batch']}): not cached, about "
                         f"{human(seconds(p, model))} before step 1 (estimated: steps x a per-step cost model, "
                         f"{source}; docs/getting-started.md)")
    return notes
