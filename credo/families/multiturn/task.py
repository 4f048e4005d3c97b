"""Expert episodes of an environment as warm-up demonstrations (the `task` of a multi-turn run).

`train(i)` plays the env's scripted expert (`env.expert_action(rng, noise)`, built-in envs) on demo seed
DEMO_SEED_BASE + i and writes the episode in the rollout's own layout: the prompt is the first observation (as the source renders it),
the answer is `action_0 EOS obs_0 action_1 EOS ... action_last` (the warm-up appends the last EOS), with the
observations rendered by the same turn format as the multi-turn source. The warm-up trains on the whole
answer, observations included, unless `sft.mask_observations` (then, as the RL loss, the model's turns only:
`meta['answer_parts']` marks each piece of the answer as the model's or the env's).
"""

from __future__ import annotations

import random

from credo.config import ConfigError
from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.latency import without_latency
from credo.tasks import Problem

DEMO_SEED_BASE = 5 * 10**9


class EnvTask:
    def __init__(self, env_cfg, tokenizer, prompt_text, observation):
        self.cfg, self.prompt_text, self.observation = env_cfg, prompt_text, observation
        self.eos = tokenizer.eos_token if tokenizer is not None else ""

    def __len__(self) -> int:
        return 10**6

    def train(self, i: int) -> Problem:
        env = make_env(self.cfg.id, **without_latency(dict(self.cfg.kwargs)))  # demonstrations: no simulated waits
        if not hasattr(env, "expert_action"):
            raise ConfigError(f"config key 'env.id' = '{self.cfg.id}' has no scripted expert for the warm-up: "
                              "expected sft.enabled: false (or an env with expert_action)")
        rng = random.Random(DEMO_SEED_BASE + i)
        obs, info = env.reset(seed=DEMO_SEED_BASE + i)
        parts: list[tuple[str, bool]] = []  # (text, the model's own): actions with their EOS, and observations
        for turn in range(self.cfg.max_turns):
            action = env.expert_action(rng, self.cfg.expert_noise)
            parts.append((action, True))
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated or turn == self.cfg.max_turns - 1:
                break
            parts[-1] = (action + self.eos, True)
            parts.append((self.observation(obs), False))
        first = env.reset(seed=DEMO_SEED_BASE + i)[0]
        return Problem(prompt=self.prompt_text(first), answer="".join(t for t, _ in parts),
                       meta={"env_seed": DEMO_SEED_BASE + i, "answer_parts": parts})

    def eval_problems(self) -> list[Problem]:
        return []  # evaluation plays held-out episodes (credo.families.multiturn.source.EnvEvaluator)
