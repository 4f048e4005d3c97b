"""Losses, advantage estimators, KL and off-policy corrections as pure torch functions.

Imports only torch, einops and the standard library, and nothing from :mod:`credo.credit`
(which may use the public names of this package, never its underscore names). Registries (name -> function) are for the
config boundary: recipes select ``algo.policy_loss``, ``algo.advantage``, ``algo.kl_estimator``.
See docs/algorithms.md for the paper index.
"""

from credo.algos._validate import LOG_RATIO_CLAMP
from credo.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_INPUTS,
    dr_grpo,
    gae,
    grpo,
    lite_ppo,
    normalize_rewards,
    rebn,
    register_advantage_estimator,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    turn_returns,
)
from credo.algos.aggregation import AGG_MODES, aggregate, global_counts, masked_mean
from credo.algos.asyppo import asyppo_masks, asyppo_value_mean, critic_shards
from credo.algos.corrections import CORRECTION_LEVELS, CORRECTION_MODES, train_infer_correction
from credo.algos.distill import distill_advantages, distill_kl_loss, mix_advantages, reverse_kl_log_ratio
from credo.algos.entropy import entropy_from_logits
from credo.algos.kept_set import kept_log_probs, kept_mask, kept_set_threshold
from credo.algos.kl import KL_ESTIMATORS, k1, k2, k3, k3_clamped, register_kl_estimator
from credo.algos.policy_losses import (
    POLICY_LOSSES,
    cispo,
    gspo,
    kimi15,
    log_ratio,
    per_token_policy_loss,
    ppo,
    register_policy_loss,
    reinforce,
    sapo,
    topr,
)
from credo.algos.ipa import ipa_loss  # registers "ipa" (chunk-level loss, arXiv 2512.24873)
from credo.algos.logprobs import fused_policy_loss_from_hidden, logprobs_from_hidden
from credo.algos.value import value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_INPUTS",
    "AGG_MODES",
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSSES",
    "aggregate",
    "asyppo_masks",
    "asyppo_value_mean",
    "cispo",
    "critic_shards",
    "distill_advantages",
    "distill_kl_loss",
    "dr_grpo",
    "entropy_from_logits",
    "fused_policy_loss_from_hidden",
    "gae",
    "global_counts",
    "grpo",
    "gspo",
    "ipa_loss",
    "k1",
    "k2",
    "k3",
    "k3_clamped",
    "kept_log_probs",
    "kept_mask",
    "kept_set_threshold",
    "kimi15",
    "lite_ppo",
    "log_ratio",
    "logprobs_from_hidden",
    "masked_mean",
    "mix_advantages",
    "normalize_rewards",
    "per_token_policy_loss",
    "ppo",
    "rebn",
    "register_advantage_estimator",
    "register_kl_estimator",
    "register_policy_loss",
    "reinforce",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "reverse_kl_log_ratio",
    "rloo",
    "sapo",
    "topr",
    "train_infer_correction",
    "turn_returns",
    "value_loss",
]

# MIPU (arXiv 2606.29526) registers its Step-1 loss ("mipu"); its Step-2 helpers live in credo.algos.mipu.
import credo.algos.mipu  # noqa: E402,F401
