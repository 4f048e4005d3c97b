"""The critic family's recipe section (`critic:`) and its load-time checks: PPO with value models, AsyPPO."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from credo.config import TinyModelConfig, checked, one_of, out_of_range, ranged, two_betas
from credo.errors import ConfigError


@dataclass
class CriticConfig:
    num_critics: int = ranged(0, ge=0, note="0 = no critic")
    """Value models (critics); >= 1 turns on PPO with GAE (algo.advantage: gae), 2 with low/high_frac is AsyPPO."""
    path: Optional[str] = None
    """Critic model: None = the actor's starting weights (after SFT), 'tiny' = built from critic.tiny, or a HF folder/hub id."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of a tiny critic (used when path is 'tiny'); it shares the actor's tiny tokenizer."""
    lr: float = ranged(1e-5, gt=0)
    """Critic learning rate (AdamW)."""
    betas: list = checked(None, two_betas, "two numbers in [0, 1)", factory=lambda: [0.9, 0.999])
    """Critic AdamW betas."""
    weight_decay: float = ranged(0.0, ge=0)
    """Critic AdamW weight decay."""
    grad_clip: float = ranged(1.0, ge=0)
    """Critic gradient-norm clip (0 disables)."""
    warmup_steps: int = ranged(0, ge=0)
    """Linear learning-rate warm-up of the critic optimizer, in critic optimizer steps."""
    critic_only_steps: int = ranged(0, ge=0)
    """First RL steps that train only the critics (the policy is not updated), as verl's critic_warmup."""
    value_clip: Optional[float] = checked(0.2, lambda v: v is None or v > 0, "> 0, or null for no value clipping")
    """Value clip range around the rollout-time values (credo.algos.value_loss); null = unclipped."""
    epochs: int = ranged(1, ge=1)
    """Passes of each critic over its shard of the batch."""
    mini_batches: int = ranged(1, ge=1)
    """Critic optimizer steps per epoch."""
    micro_batch_size: int = ranged(64, ge=1)
    """Sequences per critic forward/backward on one rank."""
    value_agg: str = one_of("mean", ("mean", "min"))
    """How the critics' values combine for GAE: mean (AsyPPO's default, Fig. 9d) or min."""
    whiten: bool = False
    """Whiten the GAE advantages over the batch's loss tokens (verl whitens, ROLL does not; off by default)."""
    kl_in_reward: float = ranged(0.0, ge=0)
    """Per-token reward -kl_in_reward * (log pi - log pi_ref) (needs model.ref_model; costs a policy forward)."""
    low_frac: float = ranged(0.0, ge=0, le=1, note="AsyPPO: 0.2")
    """AsyPPO advantage mask: share of valid tokens with the smallest inter-critic std that get no policy gradient."""
    high_frac: float = ranged(0.0, ge=0, le=1, note="AsyPPO: 0.2")
    """AsyPPO entropy filter: share of valid tokens with the largest inter-critic std that get no entropy bonus."""


def check_critic(r) -> None:
    """Critic settings against the core keys they depend on (rollout.group_size, model.ref_model, algo.advantage)."""
    c = r.critic
    if c.num_critics > r.rollout.group_size:
        raise out_of_range("critic.num_critics", c.num_critics, f"<= rollout.group_size ({r.rollout.group_size}): "
                           "each critic trains on its own responses of every group")
    if c.low_frac + c.high_frac > 1:
        raise out_of_range("critic.low_frac", c.low_frac, f"low_frac + high_frac <= 1 (critic.high_frac = {c.high_frac})")
    if (c.low_frac or c.high_frac) and c.num_critics < 2:
        raise out_of_range("critic.num_critics", c.num_critics, ">= 2 with critic.low_frac / critic.high_frac "
                           "(AsyPPO's masks rank tokens by the std across critics)")
    if c.kl_in_reward and not r.model.ref_model:
        raise out_of_range("critic.kl_in_reward", c.kl_in_reward, "0 unless model.ref_model is true")
    if c.num_critics and r.stages.advantage != "default":
        raise ConfigError(f"config key 'stages.advantage' = '{r.stages.advantage}' cannot be used with critics "
                          f"(critic.num_critics = {c.num_critics}): the critic stage is the advantage stage")
    a = r.algo.advantage
    if a == "gae" and not c.num_critics:
        raise ConfigError("config key 'algo.advantage' = 'gae' needs a value model: set critic.num_critics >= 1 "
                          "(a critic: section)")
    if c.num_critics and a != "gae":
        raise ConfigError(f"config key 'critic.num_critics' = {c.num_critics} needs algo.advantage = 'gae' "
                          f"(got '{a}'): critics give advantages by GAE")
