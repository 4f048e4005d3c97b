"""vLLM's asynchronous engine against the offline one on the same prompts (docs/vllm.md, issue 52's measurement).

    python benchmarks/vllm_async_throughput.py [--prompts 64] [--max-new-tokens 64] [--rounds 3] [--out FILE]

Both backends start on the same tiny model (the quickstart's, `build_tiny_model`) in one process, fp32, eager, with
the same KV cache. Per round, alternating which goes first (so a change in the machine's load falls on both):

- offline: `VLLMBackend.generate(prompts, seeds)`, one `LLM.generate` call;
- async: `AsyncVLLMBackend.generate(prompts, seeds)`, every request submitted, then all awaited;
- async + aborts: the same requests through the service (`submit`); every other request is aborted once it has
  received a quarter of its tokens, the others run to their end.

Reported: tokens/s (generated tokens over wall seconds) per variant, the median over rounds and the async / offline
ratio; that the two engines drew the same tokens (a check, not a speed figure); under aborts, the requests aborted,
the partial tokens they kept, whether each partial is a prefix of the offline draw, and the median seconds from
`abort()` to its result. Rows go to --out as JSON lines with the commit, date and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    import torch

    from credo.config import TinyModelConfig
    from credo.distributed.vllm_async import AsyncVLLMBackend
    from credo.distributed.vllm_backend import VLLMBackend
    from credo.models import build_tiny_model

    path = str(build_tiny_model(TinyModelConfig()))
    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(4, 98, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 48, (a.prompts,), generator=g)]
    seeds = list(range(1000, 1000 + a.prompts))
    kw = dict(kv_cache_gib=0.5, enforce_eager=True, max_model_len=256)
    offline, engine = VLLMBackend(path, **kw), AsyncVLLMBackend(path, **kw)
    rows = []
    try:
        want = offline.generate(prompts, max_new_tokens=a.max_new_tokens, seeds=seeds)  # warm-up of both
        same = [s.response_ids for s in engine.generate(prompts, max_new_tokens=a.max_new_tokens, seeds=seeds)] == \
            [s.response_ids for s in want]
        variants = {"offline": lambda: timed_generate(offline, prompts, seeds, a.max_new_tokens),
                    "async": lambda: timed_generate(engine, prompts, seeds, a.max_new_tokens),
                    "async+aborts": lambda: timed_aborts(engine, prompts, seeds, a.max_new_tokens, want)}
        for rnd in range(a.rounds):
            order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
            for name in order:
                row = {"variant": name, "round": rnd, **variants[name]()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        engine.close()
        offline.close()
    summary = summarise(rows, same, a)
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "a") as f:
            for row in rows + [summary]:
                f.write(json.dumps(row) + "\n")


def timed_generate(backend, prompts, seeds, n) -> dict:
    t0 = time.perf_counter()
    samples = backend.generate(prompts, max_new_tokens=n, seeds=seeds)
    dt = time.perf_counter() - t0
    tokens = sum(len(s.response_ids) for s in samples)
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}


def timed_aborts(engine, prompts, seeds, n, want) -> dict:
    """Every other request aborted after a quarter of its offline length (at least one token)."""
    from credo.distributed.service import GenerationRequest, SamplingSettings

    settings = SamplingSettings(max_new_tokens=n)
    t0 = time.perf_counter()
    handles = [engine.submit(GenerationRequest(tuple(p), settings, s)) for p, s in zip(prompts, seeds)]
    targets = {h: max(1, len(w.response_ids) // 4) for i, (h, w) in enumerate(zip(handles, want)) if i % 2 == 0}
    abort_s, results = [], {}
    while targets:
        results.update({r.handle: r for r in engine.take(wait=False)})
        for h in list(targets):
            if h in results:  # finished before its abort point
                del targets[h]
            elif engine.received(h) >= targets[h]:
                t = time.perf_counter()
                engine.abort(h)
                abort_s.append(time.perf_counter() - t)
                del targets[h]
        time.sleep(0.001)
    while engine.in_flight():
        results.update({r.handle: r for r in engine.take()})
    results.update({r.handle: r for r in engine.take(wait=False)})
    dt = time.perf_counter() - t0
    aborted = [(results[h], w) for h, w in zip(handles, want) if results[h].finish_reason == "abort"]
    tokens = sum(len(r.response_ids) for r in results.values())
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt, "aborted": len(aborted),
            "partial_tokens_kept": sum(len(r.response_ids) for r, _ in aborted),
            "partials_are_prefixes": all(r.response_ids == w.response_ids[:len(r.response_ids)] for r, w in aborted),
            "abort_to_result_s_median": statistics.median(abort_s) if abort_s else None}


def summarise(rows, same, a) -> dict:
    med = {v: statistics.median(r["tokens_per_s"] for r in rows if r["variant"] == v)
           for v in dict.fromkeys(r["variant"] for r in rows)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"summary": True, "prompts": a.prompts, "max_new_tokens": a.max_new_tokens, "rounds": a.rounds,
            "median_tokens_per_s": med, "async_over_offline": med["async"] / med["offline"],
            "same_tokens": same, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg": os.getloadavg()}


if __name__ == "__main__":
    main()
