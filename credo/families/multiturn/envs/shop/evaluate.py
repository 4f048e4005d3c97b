"""Success metrics of a shop policy on held-out users: full success, attribute match, failure-type breakdown.

Held-out users are env seeds EVAL_SEED_BASE + i (10^10 + i, the multi-turn source's evaluation seeds, disjoint
from training and warm-up seeds). Three ways in:
- `evaluate_policy(make_env, policy, n)`: a Python policy `policy(observations) -> action` (the scripted expert,
  a baseline);
- `evaluate_episodes(episodes)`: episodes the multi-turn source played (`MultiTurnRollout.run_episodes`); reads each
  episode's env, so episodes the source cut (env.max_turns, env.max_total_tokens) count too;
- the command line, for a trained model folder (a run's final/ or a cached warm-up), exactly as the source's
  evaluator plays it (same seeds, temperature, sampling seeds):

    python -m credo.families.multiturn.envs.shop.evaluate recipes/shop.yaml --model RUN/final --episodes 256
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Callable

from credo.families.multiturn.envs.shop.metrics import aggregate

EVAL_SEED_BASE = 10**10
"""= credo.families.multiturn.source.EVAL_SEED_BASE (not imported: this module must not pull in torch)."""


def play(env, policy: Callable[[list[str]], str], seed: int, max_turns: int | None = None) -> dict[str, float]:
    """One episode of `policy` (given every observation so far, first the request) on `env` reset with `seed`."""
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for _ in range(max_turns or env.max_turns):
        obs, _, terminated, truncated, _ = env.step(policy(seen))
        seen.append(obs)
        if terminated or truncated:
            break
    return env.episode_metrics()


def evaluate_policy(make_env: Callable[[], object], policy: Callable[[list[str]], str], n: int,
                    seed_base: int = EVAL_SEED_BASE) -> dict[str, float]:
    """aggregate() over `n` held-out users (a fresh env per episode, as the rollout source makes them)."""
    return aggregate([play(make_env(), policy, seed_base + i) for i in range(n)])


def expert_policy(env, noise: float, seed: int) -> Callable[[list[str]], str]:
    """The env's scripted expert as a policy (it reads the env's record of what the agent has seen)."""
    rng = random.Random(seed)
    return lambda _seen: env.expert_action(rng, noise)


def evaluate_episodes(episodes) -> dict[str, float]:
    """aggregate() over the multi-turn source's episodes (failed ones, whose env broke, are left out)."""
    return aggregate([e.env.episode_metrics() for e in episodes if e.end != "failed"])


def evaluate_model(recipe_path: str, model_dir: str, n: int, overrides: list[str]) -> dict[str, float]:
    """Play `n` held-out users with the model in `model_dir` through the recipe's multi-turn source (hf backend),
    at run.eval_temperature with the evaluator's sampling seeds; eval/return and the aggregate() metrics."""
    import torch

    from credo.config import load_recipe
    from credo.distributed.rollout import HFBackend
    from credo.models import load_causal_lm, load_tokenizer
    from credo.tasks.render import prompt_renderer
    from credo.families.multiturn.source import MultiTurnRollout
    from credo.train.rollout import step_seed

    r = load_recipe(recipe_path, overrides)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir).eval()
    torch.set_num_threads(r.run.threads)
    src = MultiTurnRollout(r.env, tok, HFBackend(model, tok), seed=r.run.seed, prompts_per_step=1, group_size=1,
                           temperature=r.run.eval_temperature, top_p=1.0,
                           render=prompt_renderer(tok, r.task.system_prompt, r.task.chat_template))
    greedy = r.run.eval_temperature == 0
    with torch.no_grad():
        eps, _ = src.run_episodes([EVAL_SEED_BASE + i for i in range(n)],
                                  temperature=1.0 if greedy else r.run.eval_temperature, top_p=1.0,
                                  sample_seeds=None if greedy else [step_seed(r.run.seed, -1, i) for i in range(n)])
    out = evaluate_episodes(eps)
    out["eval/return"] = sum(sum(e.turn_rewards) for e in eps) / len(eps)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("--model", required=True, help="a Hugging Face model folder (a run's final/, a warm-up)")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    a = p.parse_args(argv)
    print(json.dumps(evaluate_model(a.recipe, a.model, a.episodes, a.overrides), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
