"""Train/inference mismatch corrections: truncated IS (TIS), masked IS (MIS), decoupled PPO.

The rollout engine samples from ``mu`` (``rollout_log_probs``), the trainer recomputes ``pi_old``
(``old_log_probs``) and clips the update around it. The correction weight ``pi_old / mu`` (ROLL
Flash arXiv 2510.11345 Sec. "train-infer correction"; TIS: Yao et al. 2025 "Your efficient RL
framework secretly brings you off-policy RL training"; decoupled PPO: Hilton et al. arXiv
2110.00641) multiplies the per-token loss. Applying it to the ``ppo`` loss *is* decoupled PPO.
"""

from __future__ import annotations

import torch

from credo.algos._validate import (
    LOG_RATIO_CLAMP,
    as_bool_mask,
    check_choice,
    check_finite,
    check_like,
    check_positive,
    check_tensor,
    masked_fill_zero,
)
from credo.algos.aggregation import masked_mean

CORRECTION_MODES = (None, "tis", "mis")
CORRECTION_LEVELS = ("token", "sequence", "geometric")


def train_infer_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str | None = "tis",
    level: str = "token",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights correcting the trainer's ``pi_old`` against the sampler ``mu``.

    ``rho`` at the chosen level (log-ratios summed over masked tokens, clamped to ±20 before exp):

    - ``token``:     ``rho_t = pi_old(a_t) / mu(a_t)``
    - ``sequence``:  ``rho_i = prod_t rho_t`` broadcast to the sequence's tokens
    - ``geometric``: ``rho_i = (prod_t rho_t)^(1/n_i)`` broadcast (length-normalised)

    Modes:

    - ``tis`` (truncated IS): ``w = min(rho, cap)``; every masked token is kept.
    - ``mis`` (masked / rejection IS): ``w = rho`` where ``low <= rho <= high``, else ``w = 0``
      (the token, or the whole sequence at sequence/geometric level, is rejected).
    - ``None``: ``w = 1``; only the metrics are computed.

    Rejected tokens keep their place in the aggregation denominator (their loss is 0), so global
    token/sequence counts computed from the original mask stay valid and split invariance holds.

    Args:
        old_log_probs: ``[B, T]`` log pi_old of the sampled tokens (trainer recomputation).
        rollout_log_probs: ``[B, T]`` log mu of the sampled tokens (inference engine).
        mask: ``[B, T]`` bool or 0/1 floating.
        mode: ``"tis"``, ``"mis"`` or None.
        level: ``"token"``, ``"sequence"`` or ``"geometric"``.
        cap: TIS upper bound (default 2.0 as in the TIS blog; ROLL's default is 1.2).
        low, high: MIS acceptance band (defaults 0.5 / 2.0; for ``geometric`` a tight band such as
            0.999 / 1.001 is usual).

    Returns:
        ``(weights, keep_mask, metrics)``: detached ``[B, T]`` weights (0 outside the mask and on
        rejected tokens), the ``[B, T]`` bool mask of kept tokens, and metrics (0-d tensors):
        ``mismatch_kl_k3`` and ``mismatch_kl_k1`` (token means of the k3 / k1 estimators of
        KL(mu || pi_old), samples being drawn from mu), ``is_weight_mean`` (token mean of the
        weights), ``is_ess`` (normalised effective sample size ``(sum w)^2 / (n sum w^2)`` in
        [0, 1] over tokens at token level, over non-empty sequences otherwise), and
        ``is_capped_frac`` (tis) or ``is_rejected_frac`` (mis) over the same units.
    """
    check_tensor("old_log_probs", old_log_probs, ndim=2, floating=True)
    check_like("rollout_log_probs", rollout_log_probs, "old_log_probs", old_log_probs)
    m = as_bool_mask(mask, "old_log_probs", old_log_probs)
    check_finite("old_log_probs", old_log_probs, m)
    check_finite("rollout_log_probs", rollout_log_probs, m)
    return _correction(
        masked_fill_zero(old_log_probs.detach(), m),
        masked_fill_zero(rollout_log_probs.detach(), m),
        m,
        mode=mode,
        level=level,
        cap=cap,
        low=low,
        high=high,
    )


def _correction(old, rollout, m, *, mode, level, cap, low, high):
    """:func:`train_infer_correction` on validated inputs that are already zero outside ``m``."""
    check_choice("correction", mode, CORRECTION_MODES)
    check_choice("correction_level", level, CORRECTION_LEVELS)
    if mode == "tis":
        check_positive("correction_cap", cap)
    if mode == "mis":
        check_positive("correction_high", high)
        if not isinstance(low, (int, float)) or low < 0 or low > high:
            raise ValueError(f"correction_low is {low!r}, expected a number in [0, correction_high={high}]")
    with torch.no_grad():
        log_rho_tok = old - rollout  # zero outside the mask
        n_tok = m.sum(-1)
        if level == "token":
            log_rho = log_rho_tok
        else:
            log_rho = log_rho_tok.sum(-1, keepdim=True)
            if level == "geometric":
                log_rho = log_rho / n_tok.clamp_min(1).unsqueeze(-1).to(log_rho.dtype)
            log_rho = log_rho.expand_as(log_rho_tok)
        rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        if mode == "tis":
            weights = rho.clamp(max=cap)
            keep = m
            flagged = rho > cap
        elif mode == "mis":
            keep = m & (rho >= low) & (rho <= high)
            weights = rho
            flagged = ~keep
        else:
            weights = torch.ones_like(rho)
            keep = m
            flagged = None
        weights = masked_fill_zero(weights, keep)

        lr = log_rho_tok.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        metrics = {
            "mismatch_kl_k3": masked_mean(lr.exp() - 1 - lr, m),
            "mismatch_kl_k1": masked_mean(-lr, m),
            "is_weight_mean": masked_mean(weights, m),
        }
        # ESS and flag fractions over the units the weights are defined on.
        if level == "token":
            unit_w, unit_valid = weights, m
            unit_flag = None if flagged is None else flagged & m
        else:
            unit_valid = n_tok > 0
            unit_w = masked_fill_zero(weights, m).sum(-1) / n_tok.clamp_min(1).to(weights.dtype)
            unit_flag = None if flagged is None else (flagged & m).any(-1)
        w = masked_fill_zero(unit_w, unit_valid)
        sum_w, sum_w2 = w.sum(), (w * w).sum()
        n_units = unit_valid.sum().to(w.dtype)
        metrics["is_ess"] = torch.where(sum_w2 > 0, sum_w * sum_w / (n_units * sum_w2).clamp_min(1e-30), 0.0)
        if mode == "tis":
            metrics["is_capped_frac"] = unit_flag.sum().to(w.dtype) / n_units.clamp_min(1)
        elif mode == "mis":
            metrics["is_rejected_frac"] = unit_flag.sum().to(w.dtype) / n_units.clamp_min(1)
    return weights, keep, metrics
