"""Episodes per second of one env played two ways: through the agent gateway (an `openai` agent, HTTP, the `agent`
rollout source) and through today's multi-turn source (one batched `generate` per turn), side by side
(docs/gateway.md, "Throughput").

    python benchmarks/gateway_vs_multiturn.py [--episodes 32] [--rounds 3] [--max-tokens 3] [--concurrent 8]
                                              [--batch-window-ms 0]

Both play `credo:GuessNumber-v0` (1-7, three turns) with the same policy (the built-in tiny model at
multiturn.yaml's shape, random weights unless --policy names a folder), the same per-turn token cap and the same
plain-text protocol: the gateway's agent (`text_agent` below, an `openai` client) sends the observation as a user
message and the answer text as its action, as the multi-turn source does. So what differs is the path: the
multi-turn source samples every live episode's turn in one `generate` call; the gateway serves each agent's call
on its own (HTTP, rendering, capture), or with --batch-window-ms > 0 the calls of concurrent agents that arrive within
that window in one `generate` (agent.batch_window_ms). The two run in
alternating rounds (after one unmeasured round of each), so a change in the machine's load falls on both. Prints episodes/s, calls/s and turns per
episode of each. Figures from a shared machine are indicative only; re-measure on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import time

ENV = "credo:GuessNumber-v0"
ENV_KWARGS = {"low": 1, "high": 7, "max_turns": 3}
MAX_TOKENS = 3


def text_agent(*, base_url, api_key, model, task):
    """The multi-turn source's protocol as an `openai` agent: observation in, answer text out, as the action."""
    import openai

    from credo.families.multiturn.envs import make_env

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    env = make_env(ENV, **ENV_KWARGS)
    obs, _ = env.reset(seed=task["seed"])
    messages, total = [{"role": "user", "content": obs}], 0.0
    for _ in range(ENV_KWARGS["max_turns"]):
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=task["max_tokens"])
        action = r.choices[0].message.content or ""
        obs, reward, terminated, truncated, _ = env.step(action)
        total += reward
        if terminated or truncated:
            break
        messages += [{"role": "assistant", "content": action or " "}, {"role": "user", "content": obs}]
    return total


class Rows:
    def __init__(self, n: int, max_tokens: int, offset: int):
        self.n, self.max_tokens, self.offset = n, max_tokens, offset

    def __len__(self):
        return self.n

    def row(self, index: int, split: str = "train") -> dict:
        return {"seed": self.offset + index, "max_tokens": self.max_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per round and path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per turn")
    ap.add_argument("--concurrent", type=int, default=8, help="agents at once through the gateway")
    ap.add_argument("--batch-window-ms", type=float, default=0.0, help="agent.batch_window_ms (0 = one call at a time)")
    ap.add_argument("--policy", default=None, help="a model folder (default: the tiny model at random weights)")
    args = ap.parse_args()

    import torch

    from credo.config import TinyModelConfig
    from credo.distributed.rollout import HFBackend
    from credo.families.agent.config import AgentConfig
    from credo.families.agent.source import AgentRollout
    from credo.families.multiturn.config import EnvConfig
    from credo.families.multiturn.source import MultiTurnRollout
    from credo.models import build_tiny_model, load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    path = args.policy or str(build_tiny_model(TinyModelConfig(num_layers=2, hidden_size=64, num_heads=2,
                                                               num_kv_heads=1, intermediate_size=192,
                                                               max_position_embeddings=768)))
    model, tok = load_causal_lm(path), load_tokenizer(path)
    backend = HFBackend(model, tok)
    env_cfg = EnvConfig(id=ENV, kwargs=dict(ENV_KWARGS), max_turns=3, max_total_tokens=256,
                        max_new_tokens_per_turn=args.max_tokens)
    multiturn = MultiTurnRollout(env_cfg, tok, backend, seed=0, prompts_per_step=args.episodes, group_size=1,
                                 temperature=1.0, top_p=1.0)
    cfg = AgentConfig(max_concurrent=args.concurrent, timeout_s=600, max_failure_frac=1.0, max_tokens=args.max_tokens,
                      batch_window_ms=args.batch_window_ms)
    gateway = AgentRollout(cfg, text_agent, Rows(args.episodes, args.max_tokens, 0), tok, backend, seed=0,
                           prompts_per_step=args.episodes, group_size=1, temperature=1.0, top_p=1.0,
                           max_context=768)
    out = {"multiturn": [], "gateway": []}
    try:
        # one unmeasured round of each first: the gateway's start, the clients' and the env's imports
        multiturn.run_episodes([-1 - i for i in range(args.episodes)], temperature=1.0, top_p=1.0,
                               sample_seeds=list(range(args.episodes)))
        gateway.play([{"seed": -1 - i, "max_tokens": args.max_tokens} for i in range(args.episodes)], "bench-warm",
                     temperature=1.0, top_p=1.0)
        for rnd in range(args.rounds):
            seeds = [rnd * args.episodes + i for i in range(args.episodes)]
            t = time.perf_counter()
            eps, stats = multiturn.run_episodes(seeds, temperature=1.0, top_p=1.0,
                                                sample_seeds=[10**6 + s for s in seeds])
            dt = time.perf_counter() - t
            out["multiturn"].append((len(eps) / dt, stats["env/turns_sum"] / dt, stats["env/turns_sum"] / len(eps)))
            gateway.task = Rows(args.episodes, args.max_tokens, rnd * args.episodes)
            rows = [gateway.task.row(i) for i in range(args.episodes)]
            results, counters, dt = gateway.play(rows, f"bench-{rnd}", temperature=1.0, top_p=1.0)
            calls = counters["gateway/requests"]
            out["gateway"].append((len(results) / dt, calls / dt, calls / len(results)))
            print(f"round {rnd}: multiturn {out['multiturn'][-1][0]:.2f} ep/s, gateway {out['gateway'][-1][0]:.2f} ep/s"
                  f" ({sum(r.error is not None for r in results)} failed)", flush=True)
    finally:
        gateway.close()
    for name, rows in out.items():
        eps, calls, turns = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{name:10s} median of {args.rounds} rounds: {eps:.2f} episodes/s, {calls:.2f} model calls/s, "
              f"{turns:.2f} turns per episode")
    ratio = statistics.median(r[0] for r in out["multiturn"]) / statistics.median(r[0] for r in out["gateway"])
    print(f"the multi-turn source plays {ratio:.2f}x the gateway's episodes/s here (machine load: indicative only)")


if __name__ == "__main__":
    main()
