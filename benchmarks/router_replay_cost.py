"""The cost of Router Replay (docs/moe.md, docs/performance.md) on the tiny Qwen3-MoE of recipes/moe.yaml (random
weights: the cost does not depend on them): hf sampling with and without routing capture, and one training
forward + backward without a record, comparing with it (the pi_old forward without replay), and replaying it.

    python benchmarks/router_replay_cost.py [--prompts 256] [--new-tokens 4] [--repeats 7] [--threads 2]

Prints a Markdown table of median wall times (and each against its baseline).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_times(fns: dict, repeats: int) -> dict:
    """Median wall time of each callable, the callables run round-robin (a drift in the machine's load then falls
    on all of them alike), after one warm-up call each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from credo import moe
    from credo.config import load_recipe
    from credo.distributed.rollout import HFBackend
    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    cfg = tiny_model_config(load_recipe("recipes/moe.yaml").model.tiny, len(tok), tok)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    backend = HFBackend(model, tok)
    g = torch.Generator().manual_seed(0)
    prompts = [[4 + int(t) for t in torch.randint(0, 90, (6,), generator=g)] for _ in range(a.prompts)]
    sampling = dict(max_new_tokens=a.new_tokens, temperature=1.0, top_p=1.0, seeds=list(range(a.prompts)))
    rows = []
    gen = median_times({"plain": lambda: backend.generate(prompts, **sampling),
                        "capture": lambda: backend.generate(prompts, **sampling, routing=True)}, a.repeats)
    rows += [("hf sampling", "no capture", gen["plain"], 1.0),
             ("hf sampling", "routing capture", gen["capture"], gen["capture"] / gen["plain"])]

    samples = backend.generate(prompts, **sampling, routing=True)
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    ids = torch.tensor([s.prompt_ids + s.response_ids + [tok.pad_token_id] * (width - len(s.prompt_ids) - len(s.response_ids))
                        for s in samples])
    record = moe.ForwardRouting(moe.pack_routing([s.routed_experts for s in samples], width,
                                                 moe.routing_shape(model)), replay=False)

    def step(mode: str):
        model.zero_grad(set_to_none=True)
        if mode == "none":
            loss = model(input_ids=ids).logits.float().log_softmax(-1).mean()
        else:
            routing = moe.ForwardRouting(record.experts, replay=mode == "replay", counts=moe.RoutingCounts())
            with moe.route(model, routing.padded(width), replay=routing.replay, counts=routing.counts):
                loss = model(input_ids=ids).logits.float().log_softmax(-1).mean()
        loss.backward()

    labels = {"none": "no record", "compare": "compare only (pi_old, replay off)",
              "replay": "replay (algo.router_replay)"}
    fb = median_times({mode: (lambda mode=mode: step(mode)) for mode in labels}, a.repeats)
    for mode, label in labels.items():
        rows.append(("forward + backward", label, fb[mode], fb[mode] / fb["none"]))
    per_token = record.experts.shape[2] * record.experts.shape[3] * record.experts.element_size()
    print(f"model: {cfg.num_hidden_layers} layers, {cfg.num_experts} experts, top-{cfg.num_experts_per_tok}; "
          f"{a.prompts} prompts x {a.new_tokens} new tokens; batch [{ids.shape[0]}, {width}]; "
          f"torch threads {a.threads}; routing record {per_token} bytes per token")
    print("| what | variant | median s | vs baseline |\n| --- | --- | --- | --- |")
    for what, label, t, ratio in rows:
        print(f"| {what} | {label} | {t:.4f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
