"""What `credo check` says about a recipe's warm-ups: for each, whether it is cached (the run reuses it at once) and,
when not, about how long it will take here, so a user knows before `credo run` whether step 1 is seconds or minutes
away.

How the time is estimated (a cost model, not a measurement of this recipe): one warm-up step is a forward and
backward pass over `batch` sequences padded to the longest of the batch, so its work is

    flops/step = batch x T x (6 x (layers x (2h^2 + 2h h_kv + 3h i) + V h) + 6 x layers x T x h)

(the weight matmuls, six flops per weight per token; the output head over the vocabulary V; attention's two T x h
products per layer), with T the padded length, estimated from 256 of the task's training demonstrations (prompt +
answer + EOS in tokens, the mean of the longest of batch-sized draws; with `sft.micro_batch_tokens` the step is the
sum of this over its length-sorted passes, each padded to its own longest). Seconds = steps x flops/step / R, where R is
this machine's throughput on such steps: the median over the warm-ups cached here that recorded their time
(`sft.json`'s `seconds` and `flops`, written by every credo warm-up since), else `DEFAULT_FLOPS_PER_S`. The estimate
is shown to one significant figure and is good to about a factor of 2: a loaded machine runs slower, a GPU far
faster (the CPU default is not meant for GPUs).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

DEFAULT_FLOPS_PER_S = 1.0e10
"""Warm-up throughput of a 2-core CPU host: the geometric mean of three warm-ups timed on one (issue 57): shop's
(400 steps at about 2.4 s each: 8.7e9 FLOP/s under this model), longtail's (150 steps in 426 s: 1.7e10) and
palette's (its two warm-ups in 13 min or more: 5.5e9 or less). Against those, the estimate is 13 % short for shop,
73 % long for longtail and about 45 % short for palette."""


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


def throughput(cache: Path) -> tuple[float, str]:
    """(FLOP/s, where the figure comes from): the median of the cached warm-ups that recorded their time here."""
    rates = []
    for f in cache.glob("*/*/sft.json") if cache.is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if d.get("seconds") and d.get("flops"):
            rates.append(d["flops"] / d["seconds"])
    if rates:
        return statistics.median(rates), f"measured on {len(rates)} warm-up(s) cached here"
    return DEFAULT_FLOPS_PER_S, "the default throughput of a 2-core CPU host"


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
    rate, source = throughput(cache_root())
    notes = []
    for p in plans:
        if p.get("unknown"):
            notes.append(f"warm-up '{p['name']}': runs before step 1 if the family's settings ask for one; its time "
                         "is not estimated here")
        elif p["cached"] is None:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps of {p['batch']}): cached or not is known at "
                         f"start-up ({p['folder']}); if not, about {human(p['flops'] / rate)} before step 1 "
                         f"(estimated: steps x a per-step cost model, {source}; docs/getting-started.md)")
        elif p["cached"]:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps): cached ({p['folder']}), reused at once")
        else:
            notes.append(f"warm-up '{p['name']}' ({p['steps']} steps of {p['batch']}): not cached, about "
                         f"{human(p['flops'] / rate)} before step 1 (estimated: steps x a per-step cost model, "
                         f"{source}; docs/getting-started.md)")
    return notes
