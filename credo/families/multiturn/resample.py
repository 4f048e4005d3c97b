"""IPA's chunk-level initialised resampling (arXiv 2512.24873, Sec. 3.2.4.4), the parallelised variant: some
training episodes start from a prefix of an expert trajectory instead of the first observation.

GEM-style games are deterministic given the seed and the action sequence, so a prefix is a list of expert
actions: the rollout source resets the episode's env with its seed and replays them through `env.step`
(`MultiTurnRollout.run_episodes(prefixes=...)`); the replayed turns and observations become part of the
prompt (response mask 0: not trained, IPA's "prefilled chunks excluded from the RL loss"), and the model plays
on from there. The anchor (number of replayed turns) is drawn uniformly from 1 .. L-1 for an expert episode of
L turns, so the model always plays at least the expert's last (the "crucial") chunk. The paper's sequential
rollback curriculum and its hybrid IL+RL loss (Eq. 10) are not built; the uniform anchor is our choice
(the paper initialises "at many anchor positions in parallel" without a distribution).
"""

from __future__ import annotations

import random

from credo.config import ConfigError


def expert_actions(env, env_seed: int, max_turns: int) -> list[str]:
    """The noiseless expert's actions on `env` reset with `env_seed`, until it ends or `max_turns` actions.

    The env must have `expert_action(rng, noise)` (the built-in envs do); `env` is reset and played here."""
    if not hasattr(env, "expert_action"):
        raise ConfigError(f"config key 'env.init_resample_frac' needs an env with a scripted expert (expert_action); "
                          f"{type(env).__name__} has none: expected env.init_resample_frac: 0")
    env.reset(seed=env_seed)
    rng, actions = random.Random(env_seed), []
    for _ in range(max_turns):
        actions.append(env.expert_action(rng, 0.0))
        _, _, terminated, truncated, _ = env.step(actions[-1])
        if terminated or truncated:
            break
    return actions


def choose_prefixes(experts: list[list[str]], resampled: list[bool], seeds: list[int]) -> list[list[str]]:
    """Per episode: the first k expert actions to replay, k uniform in 1 .. len(expert) - 1 drawn from
    random.Random(seeds[i]) (so a step's prefixes are a function of its seeds), or [] when `resampled[i]` is
    False or the expert needs a single turn."""
    out = []
    for actions, on, seed in zip(experts, resampled, seeds):
        if not on or len(actions) < 2:
            out.append([])
            continue
        out.append(actions[:random.Random(seed).randint(1, len(actions) - 1)])
    return out
