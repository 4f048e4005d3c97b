"""The palette family's recipe section (`palette:`) and its load-time checks (Reasoning Palette, arXiv 2512.17206)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from credo.config import checked, one_of, out_of_range, ranged
from credo.capabilities import Refusal
from credo.errors import ConfigError


def _z_list(v) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                               for x in v))


@dataclass
class PaletteConfig:
    enabled: bool = False
    """Reasoning Palette: every rollout samples its own latent z, decoded into prefix_len soft-prompt embeddings
    read before the prompt (by the rollout engine and every trainer forward); a warm-up trains the VAE first."""
    latent_dim: int = ranged(8, ge=1)
    """Dimension n of the latent reasoning context z."""
    prefix_len: int = ranged(4, ge=1)
    """k: soft-prompt embeddings the decoder makes from z (prefix + prompt + rollout.max_new_tokens must fit the
    model's context; checked at `credo check`)."""
    hidden_size: int = ranged(256, ge=1)
    """Width of the encoder's and the decoder's hidden layer."""
    kl_weight: float = ranged(1.0, ge=0, note="1 = the ELBO")
    """Weight of KL(q(z|x,y) || N(0,I)) in the warm-up loss (a beta-VAE below 1)."""
    free_bits: float = ranged(0.0, ge=0, note="0 = off")
    """Free bits (inferred, Kingma et al. 2016): each latent dimension's batch-mean KL counts as at least this many
    nats in the warm-up loss, so a dimension under the floor is not pushed to the prior (0 = the plain KL term)."""
    encoder_input: str = one_of("pair", ("pair", "answer"))
    """What the encoder's input is pooled over: the (question, answer) tokens ('pair', the paper's) or the answer
    tokens only ('answer', inferred: the question's operands no longer dominate the mean)."""
    vae_steps: int = ranged(200, ge=0)
    """Warm-up stage 1: VAE steps on the demonstrations with the LM frozen (inferred: the VAE is trained first)."""
    sft_steps: int = ranged(100, ge=0)
    """Warm-up stage 2: steps of SFT with prefixes from q(z|x,y), teaching the LM to condition on them."""
    sft_train_vae: bool = True
    """Stage 2 also trains the VAE (jointly with the LM; inferred), so the encoder follows the LM's hidden states."""
    batch_size: int = ranged(64, ge=1)
    """Demonstrations per warm-up step."""
    vae_lr: float = ranged(1e-3, gt=0)
    """AdamW learning rate of the VAE (both stages)."""
    sft_lr: float = ranged(1e-3, gt=0)
    """AdamW learning rate of the LM in stage 2."""
    seed: int = 0
    """Warm-up seed (the demonstrations drawn, the VAE's initial weights, the reparameterisation noise)."""
    prior_scale: float = ranged(1.0, gt=0)
    """During RL each response draws z ~ N(0, prior_scale^2 I) (1 = the prior the KL pulls q towards)."""
    inject_frac: float = ranged(1.0, ge=0, le=1)
    """Share of rollouts that draw a latent; the others get z = 0, the prior's mean (1 = every response)."""
    eval_z: Optional[list] = checked(None, _z_list, "null or a list of latent_dim numbers")
    """A fixed z for the held-out evaluation (steers it to one strategy); null = each eval sample draws its own."""
    diversity_metrics: bool = False
    """Log the within-group diversity (palette/distinct_frac, palette/strategy_entropy) without palette.enabled too,
    so a baseline without prefixes is measured the same way (with palette.enabled it is always logged)."""


def check_palette(r) -> None:
    """The palette settings against the core keys (the combinations it refuses are rows in `REFUSALS`)."""
    p = r.palette
    if p.eval_z is not None and len(p.eval_z) != p.latent_dim:
        raise out_of_range("palette.eval_z", p.eval_z, f"a list of palette.latent_dim = {p.latent_dim} numbers")
    if not p.enabled:
        return
    if r.stages.rollout not in ("default", "palette"):
        raise ConfigError(f"config key 'stages.rollout' = '{r.stages.rollout}' cannot be used with palette.enabled: "
                          "the palette source is the rollout stage (it samples a latent per response)")
    if p.vae_steps + p.sft_steps == 0:
        raise out_of_range("palette.sft_steps", p.sft_steps, "> 0 (or palette.vae_steps > 0): without a warm-up the "
                           "VAE is untrained and the policy has never seen a prefix")


def _on(section: str, pred):
    def when(r, plan) -> bool:
        s = getattr(r, section, None)
        return r.palette.enabled and s is not None and pred(s)
    return when


REFUSALS = (
    Refusal(("palette.enabled", "algo.packing"), lambda r, p: r.palette.enabled and r.algo.packing,
            "a soft prefix is read from its sample's own padded row, not from packed rows"),
    Refusal(("palette.enabled", "algo.micro_batch_tokens"), lambda r, p: r.palette.enabled and r.algo.micro_batch_tokens > 0,
            "a soft prefix is read from its sample's own padded row, not from token-budget rows"),
    Refusal(("palette.enabled", "stages.probes"), lambda r, p: r.palette.enabled and bool(r.stages.probes),
            "a probe's hooks index token positions, which the soft prefix shifts"),
    Refusal(("palette.enabled", "critic.num_critics"), _on("critic", lambda s: s.num_critics > 0),
            "the value models do not read the prefix"),
    Refusal(("palette.enabled", "mipu.enabled"), _on("mipu", lambda s: s.enabled or s.random_rollback > 0),
            "MIPU's validation samples and scores without the prefix"),
)
"""Combinations palette.enabled cannot run in (checked by the run plan with every other row)."""
