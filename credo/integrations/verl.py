"""credo's policy losses and advantage estimators inside verl: select `credo_<name>` in a verl config.

    actor_rollout_ref.actor.policy_loss.loss_mode=credo_mipu     # any name in credo.algos.POLICY_LOSSES
    algorithm.adv_estimator=credo_rloo                          # an outcome estimator of credo.algos

Registration: importing this module puts every credo policy loss in verl's `POLICY_LOSS_REGISTRY` and every
outcome advantage estimator in its `ADV_ESTIMATOR_REGISTRY` (`verl.trainer.ppo.core_algos`), under
`credo_<name>`. With credo installed in the same environment this happens by itself: credo declares a
`verl.plugins` entry point, which verl imports whenever `verl` is imported, in the driver and in every Ray
worker. Without the entry point (credo on PYTHONPATH only) set `VERL_USE_EXTERNAL_MODULES=credo.integrations.verl`.

What verl passes and where it goes:
- `old_log_prob`, `log_prob`, `advantages`, `response_mask` ([B, T] each): the loss's first four arguments;
- `rollout_is_weights` ([B, T], verl's train/inference correction when `algorithm.rollout_correction` is on):
  credo's `weights` (multiplies the per-token loss, as verl's own losses do);
- `loss_agg_mode` and `config.global_batch_info` (dp_size, batch_num_tokens, global_batch_size,
  loss_scale_factor): credo's `agg_mode`, `global_tokens = batch_num_tokens / dp_size`, `global_seqs =
  global_batch_size / dp_size`, `norm_len = loss_scale_factor` (default: the padded response length), so
  the loss is verl's `agg_loss` of credo's per-token loss; `token-sum` has no credo equivalent and is refused;
- the actor's `clip_ratio_low` / `clip_ratio_high` (else `clip_ratio`), `clip_ratio_c`, `tau_pos`, `tau_neg`:
  credo's `clip_low`, `clip_high`, `dual_clip`, `tau_pos`, `tau_neg`, for a loss that takes them (verl's own
  cispo and gspo read the clip fields the same way; verl always dual-clips PPO, so `credo_ppo` does too).
  Other keywords keep credo's defaults; `register_loss("credo_cispo_wide", "cispo", clip_high=8.0)` in a module
  of your own (listed in VERL_USE_EXTERNAL_MODULES) registers a variant with fixed keywords.

Metrics come back as `actor/<credo metric>` floats. Advantage estimators get verl's `token_level_rewards`
(summed per response), `response_mask` and `index` (the prompt uids: credo's groups); `norm_adv_by_std_in_grpo`
of verl's algorithm config becomes credo grpo's `norm_std`. Estimators that need inputs verl's generic call
does not pass (gae: values; rebn: turn rewards) are not registered; use verl's own `gae`.

MIPU (arXiv 2606.29526) in verl: verl hands the policy loss no sampler log-probs, only its correction weights,
so `credo_mipu` is dual-clip PPO times `rollout_is_weights`; with verl's token-level truncated IS at
threshold `w_max` (`algorithm.rollout_correction.rollout_is=token`, `rollout_is_threshold=2.0`) those weights
are MIPU's `min(pi_old / mu, w_max)`.

Tested against verl 0.9.1 (tests/byo/test_verl.py, run in its own venv: see docs/getting-started.md).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from credo import algos

PREFIX = "credo_"

VERL_ACTOR_FIELDS: dict[str, Callable[[Any], Any]] = {
    "clip_low": lambda c: c.get("clip_ratio_low") if c.get("clip_ratio_low") is not None else c.get("clip_ratio"),
    "clip_high": lambda c: c.get("clip_ratio_high") if c.get("clip_ratio_high") is not None else c.get("clip_ratio"),
    "dual_clip": lambda c: c.get("clip_ratio_c"),
    "tau_pos": lambda c: c.get("tau_pos"),
    "tau_neg": lambda c: c.get("tau_neg"),
}
"""credo loss keyword -> how to read it from verl's actor config (a None reading keeps credo's default)."""

OUTCOME_ESTIMATORS = tuple(k for k, kind in algos.ADVANTAGE_INPUTS.items() if kind == "outcome")
"""The credo estimators verl's generic call can feed: (rewards [B], group_ids [B], mask [B, T])."""


def aggregation_kwargs(response_mask: torch.Tensor, loss_agg_mode: str, config) -> dict:
    """credo's `agg_mode`, `global_tokens`, `global_seqs`, `norm_len` from verl's `global_batch_info`.

    verl's `agg_loss` computes `sum(m * l) / batch_num_tokens * dp_size` (token-mean) and
    `sum_i seq_i / global_batch_size * dp_size` (seq modes): credo's aggregate with the global counts divided by
    dp_size is the same number on every rank.
    """
    if loss_agg_mode not in algos.AGG_MODES:
        raise ValueError(f"verl loss_agg_mode '{loss_agg_mode}' has no credo equivalent; use one of "
                         f"{', '.join(algos.AGG_MODES)} (actor_rollout_ref.actor.loss_agg_mode)")
    info = dict((config.get("global_batch_info") if config is not None else None) or {})
    dp = info.get("dp_size") or 1
    tokens, seqs = info.get("batch_num_tokens"), info.get("global_batch_size")
    needed = tokens if loss_agg_mode == "token-mean" else seqs
    if dp > 1 and needed is None:
        raise ValueError(f"verl passed dp_size={dp} without the global count loss_agg_mode '{loss_agg_mode}' needs "
                         "(global_batch_info batch_num_tokens / global_batch_size)")
    return {"agg_mode": loss_agg_mode,
            "global_tokens": None if tokens is None else tokens / dp,
            "global_seqs": None if seqs is None else seqs / dp,
            "norm_len": info.get("loss_scale_factor") or response_mask.shape[-1]}


def loss_kwargs_from_verl(credo_name: str, config) -> dict:
    """The keywords of credo loss `credo_name` that verl's actor config sets (see VERL_ACTOR_FIELDS)."""
    params = inspect.signature(algos.POLICY_LOSSES[credo_name]).parameters
    out = {}
    for key, read in VERL_ACTOR_FIELDS.items():
        value = read(config) if config is not None and key in params else None
        if value is not None:
            out[key] = value
    return out


def _as_float(v) -> float:
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


def verl_policy_loss(credo_name: str, **fixed_kwargs) -> Callable:
    """credo's `POLICY_LOSSES[credo_name]` with verl's policy-loss signature (see the module docstring).

    Returns:
        `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
        -> (loss, {"actor/<metric>": float})`, the tensors [B, T].
    """
    if credo_name not in algos.POLICY_LOSSES:
        raise ValueError(f"'{credo_name}' is not in credo.algos.POLICY_LOSSES "
                         f"(known: {', '.join(sorted(algos.POLICY_LOSSES))})")
    credo_loss = algos.POLICY_LOSSES[credo_name]

    def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                    rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        kwargs = {**loss_kwargs_from_verl(credo_name, config), **fixed_kwargs}
        loss, metrics = credo_loss(log_prob, old_log_prob, advantages, response_mask, weights=rollout_is_weights,
                                   **aggregation_kwargs(response_mask, loss_agg_mode, config), **kwargs)
        return loss, {f"actor/{k}": _as_float(v) for k, v in metrics.items()}

    policy_loss.__name__ = policy_loss.__qualname__ = f"{PREFIX}{credo_name}"
    policy_loss.__doc__ = f"credo's '{credo_name}' policy loss in verl's signature.\n\n{credo_loss.__doc__ or ''}"
    return policy_loss


def verl_advantage_estimator(credo_name: str, **fixed_kwargs) -> Callable:
    """credo's outcome estimator `credo_name` with verl's signature.

    Returns:
        `fn(token_level_rewards [B, T], response_mask [B, T], index [B] (prompt uids), config, **_)
        -> (advantages [B, T], returns [B, T])`; returns are the advantages, as for verl's outcome estimators.
    """
    if credo_name not in OUTCOME_ESTIMATORS:
        raise ValueError(f"'{credo_name}' is not an outcome estimator of credo.algos (verl can feed: "
                         f"{', '.join(OUTCOME_ESTIMATORS)})")
    estimator = algos.ADVANTAGE_ESTIMATORS[credo_name]
    takes_norm_std = "norm_std" in inspect.signature(estimator).parameters

    def advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None,
                  **_verl_extras) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError(f"{PREFIX}{credo_name} needs verl's prompt uids (`index`) to form groups")
        _, group_ids = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
        kwargs = dict(fixed_kwargs)
        if takes_norm_std and config is not None and config.get("norm_adv_by_std_in_grpo") is not None:
            kwargs.setdefault("norm_std", bool(config.get("norm_adv_by_std_in_grpo")))
        with torch.no_grad():
            adv = estimator(token_level_rewards.sum(-1), torch.as_tensor(group_ids, device=token_level_rewards.device),
                            response_mask, **kwargs)
        return adv, adv

    advantage.__name__ = advantage.__qualname__ = f"{PREFIX}{credo_name}"
    return advantage


def register_loss(verl_name: str, credo_name: str, **fixed_kwargs) -> None:
    """Register credo's `credo_name` loss (with `fixed_kwargs` over credo's defaults) as verl's `verl_name`."""
    core_algos.register_policy_loss(verl_name)(verl_policy_loss(credo_name, **fixed_kwargs))


def register(prefix: str = PREFIX) -> list[str]:
    """Put every credo policy loss and outcome estimator in verl's registries as `<prefix><name>`.

    Safe to call again (verl's estimator registry refuses a second, different function under one name, so
    a name already registered by this module is left as it is). Returns the names registered.
    """
    names = []
    for name in sorted(algos.POLICY_LOSSES):
        register_loss(prefix + name, name)
        names.append(prefix + name)
    for name in OUTCOME_ESTIMATORS:
        if prefix + name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(prefix + name)(verl_advantage_estimator(name))
        names.append(prefix + name)
    return names


REGISTERED = register()
"""The verl names this import registered."""
