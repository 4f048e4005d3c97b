"""The multi-turn family's recipe section (`env:`), its checks, and the settings of its `turn_credit` stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from credo.config import checked, one_of, out_of_range, ranged
from credo.config.sections import RoleConfig
from credo.errors import ConfigError


@dataclass
class EnvConfig:
    id: Optional[str] = None
    """Multi-turn environment (GEM's protocol, docs/multiturn.md): 'credo:GuessNumber-v0', 'credo:Mastermind-v0',
    'credo:Shop-v0[-tiny|-easy|-hard]' (built-in; docs/shop.md), 'shopsim:<id>' (the real ShopSimulator) or a
    gem.make id such as 'game:GuessTheNumber-v0-easy'; null = no environment (single-turn tasks).
    Needs stages.rollout: multiturn."""
    kwargs: dict = field(default_factory=dict)
    """Constructor overrides of the environment (gem.make(id, **kwargs)), e.g. {max_turns: 5}."""
    max_turns: int = ranged(4, ge=1)
    """Model turns per episode; an episode still running after the last one is truncated."""
    max_total_tokens: int = ranged(256, ge=2)
    """Cap on prompt + all turns + observations; an episode that would pass it ends truncated."""
    max_new_tokens_per_turn: int = ranged(16, ge=1)
    """Generation length cap of one model turn (the turn ends at EOS or here)."""
    step_timeout_s: float = ranged(10.0, gt=0)
    """An env reset or step that runs longer ends its episode as a failure (masked out, counted in env/failures)."""
    max_failure_frac: float = ranged(0.5, ge=0, le=1)
    """Stop the run when more than this fraction of a step's episodes fail."""
    observation_template: str = checked("auto", lambda v: v == "auto" or "{observation}" in v,
                                        "auto, or a string with '{observation}'")
    """How an observation follows the model's turn: 'auto' = the tokenizer's chat template (a user turn, then the
    assistant header), or '\\n{observation}\\n' without one; or a string with '{observation}'."""
    expert_noise: float = ranged(0.0, ge=0, le=1)
    """Warm-up demonstrations (built-in envs with an expert): probability of a random action in each expert turn."""
    init_resample_frac: float = ranged(0.0, ge=0, le=1)
    """IPA's chunk-level initialised resampling (arXiv 2512.24873 Sec. 3.2.4.4, parallelised initialisation): this
    fraction of each game's training episodes starts from a prefix of the noiseless expert's episode on the same
    seed, replayed through the env (anchor uniform over the expert's turns but its last). 0 = every episode from
    the start. Needs an env with a scripted expert; evaluation always starts from the start."""
    trajectory_async: bool = False
    """Trajectory-level asynchrony (RollArc): each episode's next turn is sampled as soon as its own env step returns,
    with the other episodes ready then, instead of one generate call per turn after the batch's slowest env step.
    false = turn-synchronous (the default)."""
    eval_episodes: int = ranged(64, ge=1)
    """Held-out episodes (fixed seeds disjoint from training) per evaluation; eval/return is their mean return."""


@dataclass
class EnvRoleConfig(RoleConfig):
    """`cluster.env:`: multi-turn environments held by env actors, so env steps leave the trainer processes."""

    max_concurrency: int = ranged(64, ge=1)
    """Env calls one env worker runs at once (threads), so one hung env step blocks only its own episode."""


CREDITS = ("mc_rebn", "mc", "grpo", "ipa")
LATENCY_KEYS = ("latency_s", "latency_sigma")
"""env.kwargs of the built-in games' simulated step latency (envs/latency.py): left out of the warm-up's expert
demonstrations and of its cache key."""


@dataclass
class TurnCreditSettings:
    """`stages.advantage_kwargs` of the `turn_credit` advantage stage (credo.families.multiturn.turn_credit)."""

    credit: str = one_of("mc_rebn", CREDITS)
    """mc_rebn (GEM's returns + ReBN), mc (returns, no normalisation), grpo (trajectory level) or ipa (chunk returns)."""
    gamma: float = ranged(1.0, ge=0, le=1)
    """Per-turn discount of the Monte-Carlo (and IPA chunk) returns."""
    eps: float = ranged(1e-9, gt=0)
    """ReBN's epsilon in the std division."""


def env_rollouts(r) -> list[str]:
    """The rollout stages of the recipe's families that play the `env:` section's environment: those whose StageEntry
    provides `env_episodes` (declared in each family's table, so no family adds itself to another's list)."""
    from credo.capabilities import ENV_EPISODES
    from credo.family import families_of

    return sorted(name for fam in families_of(r) for name, entry in fam.stages.get("rollout", {}).items()
                  if ENV_EPISODES in entry.provides)


def check_env(r) -> None:
    players = env_rollouts(r)
    e, multi = r.env, r.stages.rollout in players
    if multi and not e.id:
        raise ConfigError(f"config key 'stages.rollout' = '{r.stages.rollout}' needs an environment: set env.id "
                          "(e.g. 'credo:GuessNumber-v0' or 'game:GuessTheNumber-v0-easy')")
    if e.id and not multi:
        raise ConfigError(f"config key 'env.id' = '{e.id}' is set but stages.rollout is '{r.stages.rollout}': "
                          f"expected stages.rollout: {' or '.join(players)} (a source that plays the "
                          "environment)")
    if e.id and r.stages.reward == "default":
        raise ConfigError(f"config key 'env.id' = '{e.id}' needs stages.reward: env (the episode return) or a reward "
                          "stage of your own; the default reward scores single-turn task answers")
    if e.id and e.max_new_tokens_per_turn >= e.max_total_tokens:
        raise out_of_range("env.max_new_tokens_per_turn", e.max_new_tokens_per_turn,
                           f"< env.max_total_tokens ({e.max_total_tokens})")
    if (r.stages.advantage == "turn_credit" and r.stages.advantage_kwargs.get("credit") == "grpo"
            and r.rollout.group_size < 2):
        raise out_of_range("rollout.group_size", r.rollout.group_size, ">= 2 with turn_credit's credit: grpo "
                           "(the group baseline)")
