"""MIPU: Monotonic Inference Policy Update (Liang, Tang, Ma et al., arXiv 2606.29526).

The deployed policy is the inference engine's ``mu`` (e.g. FP8 vLLM), not the trainer's ``pi``.
MIPU asks for ``J(mu_{k+1}) >= J(mu_k)`` and splits each sync round in two steps:

- Step 1 (:func:`mipu`, registered as policy loss ``"mipu"``): a sampler-referenced update,
  the dual-clipped PPO/GRPO surrogate on ``r = pi_theta / pi_old`` times the truncated,
  detached pre-update mismatch weight ``min(pi_old / mu, w_max)``.
- Step 2 (:func:`mipu_t_post`, :func:`mipu_threshold`, :func:`mipu_accept`): after syncing the
  candidate to the sampler, estimate the post-update inference gap ``T_post = J(mu_{k+1}) -
  J(pi_{k+1})`` on validation rollouts and roll back when ``T_post < -c_k``.

The official code was not found; the spec (``specs/05_mipu.md``) reconstructs the equations from
a technical review. Inferred details are marked as such below.
"""

from __future__ import annotations

import math

import torch

from credo.algos._validate import (
    LOG_RATIO_CLAMP,
    as_bool_mask,
    check_finite,
    check_like,
    check_tensor,
    masked_fill_zero,
    shape_str,
)
from credo.algos.aggregation import masked_mean
from credo.algos.policy_losses import per_token_policy_loss, ppo, register_policy_loss

__all__ = ["mipu", "mipu_accept", "mipu_t_post", "mipu_threshold", "mipu_weights"]


def _check_w_max(w_max) -> None:
    if isinstance(w_max, bool) or not isinstance(w_max, (int, float)) or not w_max >= 1 or math.isnan(w_max):
        raise ValueError(f"w_max is {w_max!r}, expected a number >= 1 (the truncation of pi_old / mu)")


def mipu_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    w_max: float = 2.0,
    sequence_level: bool = False,
) -> torch.Tensor:
    """MIPU Step-1 weight ``wbar = min(w, w_max)``, detached, 0 outside ``mask`` (arXiv 2606.29526).

    - token level (default): ``w_t = pi_old(a_t) / mu(a_t)``. The paper's objective indexes
      ``w_{i,t}``; token level is the spec's (inferred) reading.
    - ``sequence_level=True``: ``w_i = exp(mean_t (log pi_old - log mu))``, the *geometric mean*
      of the token ratios over the masked tokens, broadcast to the sequence's tokens. Length
      normalisation is inferred from Step 2's ``rho_i``; the product over thousands of tokens
      would be almost always 0 or truncated.

    Log-ratios are clamped to [-20, 20] before ``exp``.

    Args:
        old_log_probs: ``[B, T]`` log pi_old (trainer recomputation with the synced weights).
        rollout_log_probs: ``[B, T]`` log mu of the sampler.
        mask: ``[B, T]`` bool or 0/1 floating.
        w_max: truncation (>= 1; paper 2).
        sequence_level: token (False) or sequence (True) weights.

    Returns:
        ``[B, T]`` detached weights.
    """
    _check_w_max(w_max)
    check_tensor("old_log_probs", old_log_probs, ndim=2, floating=True)
    check_like("rollout_log_probs", rollout_log_probs, "old_log_probs", old_log_probs)
    m = as_bool_mask(mask, "old_log_probs", old_log_probs)
    check_finite("old_log_probs", old_log_probs, m)
    check_finite("rollout_log_probs", rollout_log_probs, m)
    with torch.no_grad():
        log_w = masked_fill_zero(old_log_probs, m) - masked_fill_zero(rollout_log_probs, m)
        if sequence_level:
            n = m.sum(-1, keepdim=True).clamp_min(1).to(log_w.dtype)
            log_w = (log_w.sum(-1, keepdim=True) / n).expand_as(log_w)
        w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().clamp(max=w_max)
        return masked_fill_zero(w, m)


def mipu(
    log_probs,
    old_log_probs,
    advantages,
    mask,
    *,
    rollout_log_probs=None,
    w_max=2.0,
    sequence_level=False,
    clip_low=0.2,
    clip_high=0.2,
    dual_clip=3.0,
):
    """MIPU Step 1: sampler-referenced truncated-IS dual-clip PPO (arXiv 2606.29526, Sec. 3)::

        w_t  = pi_old(a_t) / mu(a_t)                 (pre-update mismatch, trainer vs sampler)
        wbar = sg[min(w_t, w_max)]                   (truncated, detached; paper w_max = 2)
        l_t  = wbar_t * l^dc_t(r_t),  r_t = pi_theta(a_t) / pi_old(a_t)

    ``l^dc`` is the dual-clipped PPO token loss of :func:`credo.algos.ppo` (only ``r`` is clipped,
    the paper's "TIS" variant; clipping the full product ``w r`` over-clips, Appendix B). See
    :func:`mipu_weights` for ``sequence_level``.

    Aggregation: the paper's ``1/G sum_i 1/T_i sum_t`` (mean over a sequence's tokens, then over
    sequences; the expectation over groups makes it a mean over all sequences) is
    ``agg_mode="seq-mean-token-mean"``; the common default ``token-mean`` weights sequences by
    length, so recipes reproducing the paper set ``agg_mode: seq-mean-token-mean``.

    Without ``rollout_log_probs`` the weight is 1 (sampler assumed identical to the trainer) and
    the loss is dual-clip PPO. The common ``correction`` keyword multiplies a *second*
    ``pi_old / mu`` weight on top of ``wbar``: leave it unset (``correction=None``) with MIPU.

    Args (besides the common ones, see :mod:`credo.algos.policy_losses`):
        log_probs, old_log_probs, advantages, mask: ``[B, T]``.
        rollout_log_probs: ``[B, T]`` log mu of the sampler (from the wrapper).
        w_max: truncation of the mismatch weight (>= 1).
        sequence_level: sequence-level (geometric-mean) instead of token-level weights.
        clip_low, clip_high: clip epsilons of ``r`` (the paper's values are not stated; 0.2).
        dual_clip: dual-clip constant ``c > 1`` or None. The paper uses dual clip but its ``c`` is
            not stated; 3 (the dual-clip paper's, arXiv 1912.09729) is *inferred*.

    Metrics: ``mipu_w_mean`` (token mean of ``wbar``), ``mipu_w_capped_frac`` (masked tokens whose
    ``w > w_max``), plus ppo's ``clipfrac_low``/``clipfrac_high``/``dual_clipfrac`` and the
    ratio metrics.

    Raises:
        ValueError: ``w_max`` < 1 (naming it), ``dual_clip`` <= 1, and the wrapper's checks.
    """
    _check_w_max(w_max)
    # the dual-clip PPO kernel (the function under ppo's per_token_policy_loss wrapper)
    token_loss, metrics = ppo.__wrapped__(
        log_probs, old_log_probs, advantages, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if rollout_log_probs is None:
        w = masked_fill_zero(torch.ones_like(token_loss), mask).detach()
        capped = torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    else:
        w = mipu_weights(old_log_probs, rollout_log_probs, mask, w_max=w_max, sequence_level=sequence_level)
        with torch.no_grad():
            capped = masked_mean((w >= w_max).to(w.dtype), mask)
    metrics["mipu_w_mean"] = masked_mean(w, mask)
    metrics["mipu_w_capped_frac"] = capped
    return w * token_loss, metrics


mipu = register_policy_loss("mipu")(per_token_policy_loss(mipu))


def mipu_t_post(
    log_probs_new: torch.Tensor,
    sampler_log_probs_new: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> float:
    """MIPU Step-2 estimate of the post-update inference gap (arXiv 2606.29526, Sec. 4)::

        T_post = J(mu_{k+1}) - J(pi_{k+1}) ~= -mean_i rho_i A_i
        rho_i  = exp(mean_t (log pi_{k+1}(a_it) - log mu_{k+1}(a_it)))   (length-normalised)

    over validation responses ``y_i ~ mu_{k+1}``; ``A_i`` are their group-relative advantages
    (GRPO normalisation as in training is *inferred*). The mean runs over sequences with at least
    one masked-in token; ``mean_t`` is clamped to [-20, 20] before ``exp``.

    Args:
        log_probs_new: ``[B, T]`` log pi_{k+1} of the validation tokens (trainer, candidate weights).
        sampler_log_probs_new: ``[B, T]`` log mu_{k+1} (sampler after syncing the candidate).
        advantages: ``[B]`` one advantage per validation response.
        mask: ``[B, T]`` bool or 0/1 floating, True on response tokens.

    Returns:
        ``T_post`` as a Python float (computed in float64).

    Raises:
        ValueError: wrong shapes (naming the argument), NaN/Inf at masked-in positions or in
            ``advantages``, or a mask with no token (no validation response to estimate from).
    """
    check_tensor("log_probs_new", log_probs_new, ndim=2, floating=True)
    check_like("sampler_log_probs_new", sampler_log_probs_new, "log_probs_new", log_probs_new)
    check_tensor("advantages", advantages, ndim=1, floating=True)
    if advantages.shape[0] != log_probs_new.shape[0]:
        raise ValueError(
            f"advantages has shape {shape_str(advantages)}, expected [{log_probs_new.shape[0]}] "
            f"(one per row of log_probs_new {shape_str(log_probs_new)})"
        )
    m = as_bool_mask(mask, "log_probs_new", log_probs_new)
    check_finite("log_probs_new", log_probs_new, m)
    check_finite("sampler_log_probs_new", sampler_log_probs_new, m)
    check_finite("advantages", advantages)
    n = m.sum(-1)
    rows = n > 0
    if not bool(rows.any()):
        raise ValueError("mask has no masked-in token: T_post needs at least one validation response")
    with torch.no_grad():
        d = (masked_fill_zero(log_probs_new, m) - masked_fill_zero(sampler_log_probs_new, m)).double()
        mean_d = d.sum(-1)[rows] / n[rows].double()
        rho = mean_d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        return float(-(rho * advantages.detach().double()[rows]).mean())


def mipu_threshold(step: int, c_start: float, c_end: float, anneal_steps: int = 100) -> float:
    """Tolerance ``c_k`` of MIPU's acceptance test (arXiv 2606.29526, Sec. 4).

    Linear from ``c_start`` at ``step = 0`` to ``c_end`` at ``step = anneal_steps``, constant
    after: ``c_k = c_start + (c_end - c_start) * min(step, anneal_steps) / anneal_steps``
    (``anneal_steps = 0``: always ``c_end``). Paper: 100 steps; Qwen3-4B ``1e-3 -> 0``,
    Qwen3-1.7B ``4e-3 -> 1e-3``. Steps count from 0 (the first update); whether the paper counts
    from 0 or 1 is not stated.

    Raises:
        ValueError: ``step`` or ``anneal_steps`` not a non-negative integer, or a non-finite
            ``c_start``/``c_end`` (each named).
    """
    for name, v in (("step", step), ("anneal_steps", anneal_steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} is {v!r}, expected an integer >= 0")
    for name, v in (("c_start", c_start), ("c_end", c_end)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} is {v!r}, expected a finite number")
    if step >= anneal_steps:  # exactly c_end (c_start + (c_end - c_start) * 1 can miss it by a rounding)
        return float(c_end)
    return c_start + (c_end - c_start) * step / anneal_steps


def mipu_accept(t_post: float, c_k: float) -> bool:
    """MIPU's decision (arXiv 2606.29526, Sec. 4): accept the candidate ``(pi_{k+1}, mu_{k+1})``
    iff ``t_post >= -c_k``; otherwise roll back to ``(pi_k, mu_k)`` (trainer weights, optimizer
    state -- *inferred* -- and re-sync the sampler).

    Raises:
        ValueError: a NaN ``t_post`` or ``c_k`` (naming it): no decision can be made from it.
    """
    for name, v in (("t_post", t_post), ("c_k", c_k)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise ValueError(f"{name} is {v!r}, expected a number (not NaN)")
    return bool(t_post >= -c_k)
