"""The agent gateway's per-call overhead: the same calls through HTTP (openai client -> uvicorn -> capture) and
straight into the rollout backend (docs/gateway.md).

    python benchmarks/gateway_overhead.py [--calls 30] [--turns 3] [--max-tokens 16] [--rounds 3]

The policy is the built-in tiny model (default TinyModelConfig), sampled by `HFBackend` on the CPU. Each episode
is `--turns` calls of a growing conversation (the answer echoed, a user turn added), the way an agent calls.
`direct`: the same prompts' token ids given to `backend.generate` (what a credo multi-turn source pays per call);
`gateway`: the openai client's calls through the gateway. The two run in alternating rounds so a change in the
machine's load falls on both. Prints the median seconds per call of each, and their difference: the HTTP,
rendering and capture overhead. Figures from a shared machine are indicative only; re-measure on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=30, help="calls per round (episodes x turns)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import openai
    import torch

    from credo.config import TinyModelConfig
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler
    from credo.models import build_tiny_model, load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    path = str(build_tiny_model(TinyModelConfig(max_position_embeddings=1024)))
    model, tok = load_causal_lm(path), load_tokenizer(path)
    backend = HFBackend(model, tok)
    episodes = max(1, args.calls // args.turns)

    def via_gateway(gw, round_: int) -> list[float]:
        times = []
        for e in range(episodes):
            client = openai.OpenAI(base_url=gw.base_url, api_key=gw.episode_key(f"r{round_}-e{e}"), max_retries=0)
            messages = [{"role": "user", "content": f"episode {e}: play"}]
            for _ in range(args.turns):
                t = time.perf_counter()
                r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=args.max_tokens)
                times.append(time.perf_counter() - t)
                messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                             {"role": "user", "content": "again"}]
        return times

    def direct(gw, round_: int) -> list[float]:
        """The prompts the gateway built in the same round, straight into the backend."""
        times = []
        for e in range(episodes):
            for call in gw.store.episode_calls(f"r{round_}-e{e}"):
                seeds = [hash((round_, e, call.index)) % 2**31]
                t = time.perf_counter()
                backend.generate([call.prompt_ids], max_new_tokens=args.max_tokens, temperature=1.0, top_p=1.0,
                                 seeds=seeds)
                times.append(time.perf_counter() - t)
        return times

    rows = {"gateway": [], "direct": []}
    with Gateway(backend_sampler(backend), tok, model_name="tiny", max_tokens=args.max_tokens) as gw:
        via_gateway(gw, -1)  # warm-up: imports, first HTTP connection
        for r in range(args.rounds):
            rows["gateway"] += via_gateway(gw, r)
            rows["direct"] += direct(gw, r)
    g, d = statistics.median(rows["gateway"]), statistics.median(rows["direct"])
    print(f"calls per variant: {len(rows['gateway'])} (tiny model, HFBackend on CPU, max_tokens {args.max_tokens})")
    print(f"direct backend.generate: median {d * 1e3:.1f} ms/call")
    print(f"through the gateway:     median {g * 1e3:.1f} ms/call")
    print(f"overhead (HTTP, rendering, capture): {(g - d) * 1e3:.1f} ms/call ({(g / d - 1) * 100:.0f}%)")


if __name__ == "__main__":
    main()
