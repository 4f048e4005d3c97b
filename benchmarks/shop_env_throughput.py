"""Throughput of the shop env (credo.families.multiturn.envs.shop): the env alone, and inside the multi-turn source.

1. Env alone: env steps per second of expert episodes (error rate `--noise`), a fresh env per episode as the
   rollout source makes them, on catalogues of 1k and 100k products (the 'medium' level's other settings), and
   the one-time catalogue + search-index build. Baseline in the same run: the built-in guess-the-number env
   (credo:GuessNumber-v0, the same harness and expert), as a ratio.
2. Inside today's multi-turn source (credo.families.multiturn.source.MultiTurnRollout.run_episodes, hf backend, sampling at
   temperature 1): episodes per second of the recipe's tiny char-level Qwen2 (recipes/shop.yaml's model; a
   random init unless `--model` names a trained folder, e.g. a cached warm-up) on credo:Shop-v0-tiny, against the
   guess game with the same model and settings as the baseline (ratio). Each is the median of `--rounds` rounds,
   alternating, so a change in the machine's load falls on both.

Usage (repository root, project venv):
    python benchmarks/shop_env_throughput.py [--episodes 2000] [--rounds 3] [--source-episodes 64] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from credo.families.multiturn.envs import make_env  # noqa: E402
from credo.families.multiturn.envs.shop.catalogue import build_catalogue  # noqa: E402
from credo.families.multiturn.envs.shop.search import index_for  # noqa: E402


def env_steps_per_s(make, episodes: int, noise: float) -> tuple[float, float]:
    """(steps/s, mean steps per episode) of the env's expert over `episodes` seeds, a fresh env each."""
    steps, t0 = 0, time.perf_counter()
    for s in range(episodes):
        env = make()
        env.reset(seed=s)
        rng = random.Random(s)
        for _ in range(env.max_turns):
            _, _, terminated, truncated, _ = env.step(env.expert_action(rng, noise))
            steps += 1
            if terminated or truncated:
                break
    return steps / (time.perf_counter() - t0), steps / episodes


def bench_env(episodes: int, noise: float, rounds: int) -> None:
    print(f"## env alone: expert at error rate {noise}, {episodes} episodes, median of {rounds} rounds")
    print("| env | catalogue build (s) | steps/s | steps/episode | ratio to guess |")
    print("|---|---|---|---|---|")
    for n in (1000, 100_000):
        t0 = time.perf_counter()
        index_for(build_catalogue(n, 0, 6, (20, 20, 12, 10, 5)))
        build = time.perf_counter() - t0
        shop = lambda n=n: make_env("credo:Shop-v0", n_products=n, vocab=(20, 20, 12, 10, 5))  # noqa: E731
        guess = lambda: make_env("credo:GuessNumber-v0", low=1, high=7, max_turns=3)  # noqa: E731
        s_rates, g_rates = [], []
        for _ in range(rounds):
            s_rates.append(env_steps_per_s(shop, episodes, noise))
            g_rates.append(env_steps_per_s(guess, episodes, noise))
        s, g = statistics.median(r[0] for r in s_rates), statistics.median(r[0] for r in g_rates)
        print(f"| credo:Shop-v0, {n} products | {build:.2f} | {s:,.0f} | {s_rates[0][1]:.2f} | {s / g:.3f} |")
        print(f"| credo:GuessNumber-v0 (baseline) | - | {g:,.0f} | {g_rates[0][1]:.2f} | 1 |")


def source_for(env_id: str, kwargs: dict, model, tok, max_turns: int, max_total: int, per_turn: int):
    from credo.families.multiturn.config import EnvConfig
    from credo.distributed.rollout import HFBackend
    from credo.tasks.render import plain_prompt
    from credo.families.multiturn.source import MultiTurnRollout

    cfg = EnvConfig(id=env_id, kwargs=kwargs, max_turns=max_turns, max_total_tokens=max_total,
                    max_new_tokens_per_turn=per_turn, step_timeout_s=30.0)
    return MultiTurnRollout(cfg, tok, HFBackend(model, tok), seed=0, prompts_per_step=1, group_size=1,
                            temperature=1.0, top_p=1.0, render=plain_prompt)


def bench_source(model_dir: str | None, episodes: int, rounds: int) -> None:
    import torch

    from credo.config import load_recipe
    from credo.models import build_tiny_model, load_causal_lm, load_tokenizer

    r = load_recipe(ROOT / "recipes" / "shop.yaml")
    folder = model_dir or str(build_tiny_model(r.model.tiny))
    tok, model = load_tokenizer(folder), load_causal_lm(folder).eval()
    torch.set_num_threads(r.run.threads)
    shop = source_for(r.env.id, dict(r.env.kwargs), model, tok, r.env.max_turns, r.env.max_total_tokens,
                      r.env.max_new_tokens_per_turn)
    guess = source_for("credo:GuessNumber-v0", {"low": 1, "high": 7, "max_turns": 3}, model, tok, 3,
                       r.env.max_total_tokens, r.env.max_new_tokens_per_turn)
    print(f"\n## inside the multi-turn source: {episodes} episodes a round (one run_episodes call), "
          f"median of {rounds} rounds, model {'random init' if model_dir is None else model_dir}, "
          f"{r.run.threads} torch threads")
    print("| env | episodes/s | turns/episode | ratio to guess |")
    print("|---|---|---|---|")
    rates: dict[str, list] = {"shop": [], "guess": []}
    seeds = list(range(episodes))
    with torch.no_grad():
        for k in range(rounds):
            for name, src in (("shop", shop), ("guess", guess)) if k % 2 == 0 else (("guess", guess), ("shop", shop)):
                t0 = time.perf_counter()
                eps, stats = src.run_episodes(seeds, temperature=1.0, top_p=1.0, sample_seeds=[k * 10**6 + s for s in seeds])
                rates[name].append((episodes / (time.perf_counter() - t0), stats["env/turns_sum"] / episodes))
    s, g = statistics.median(x[0] for x in rates["shop"]), statistics.median(x[0] for x in rates["guess"])
    print(f"| {r.env.id} | {s:.2f} | {rates['shop'][0][1]:.2f} | {s / g:.3f} |")
    print(f"| credo:GuessNumber-v0 (baseline) | {g:.2f} | {rates['guess'][0][1]:.2f} | 1 |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=2000, help="env-alone episodes per round")
    p.add_argument("--noise", type=float, default=0.0, help="the expert's error rate in the env-alone part")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--source-episodes", type=int, default=64, help="episodes per round inside the source (0 = skip)")
    p.add_argument("--model", default=None, help="a trained model folder (default: the recipe's tiny model, random)")
    a = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# shop env throughput, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.strip()}, "
          f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    bench_env(a.episodes, a.noise, a.rounds)
    if a.source_episodes:
        bench_source(a.model, a.source_episodes, a.rounds)


if __name__ == "__main__":
    main()
