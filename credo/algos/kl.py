"""Per-token KL(pi || pi_ref) estimators on sampled tokens (Schulman, "Approximating KL
divergence", 2020), registered for recipes (``algo.kl_estimator: <name>``).

Each entry: ``fn(log_probs [B, T], ref_log_probs [B, T], *, mask=None) -> [B, T]``. Tokens are
sampled from pi (the current/rollout policy), so with ``d = log pi - log pi_ref``:

- ``k1``: ``d`` (unbiased, high variance, can be negative);
- ``k2``: ``d^2 / 2`` (biased, low variance; its gradient is the true KL gradient on-policy);
- ``k3``: ``exp(-d) - 1 + d`` (unbiased, non-negative, low variance), output **not** clamped;
- ``k3_clamped``: k3 with the output clamped to [-10, 10], as verl's ``low_var_kl``. Note that
  verl's ``k3`` is an alias of its ``low_var_kl``, i.e. credo's ``k3_clamped``, not credo's ``k3``.

All clamp ``d`` to [-20, 20] before ``exp``. Use as a loss term (``aggregate(kl, mask)``) or as a
reward penalty (``token_rewards - beta * kl.detach()``). With ``mask`` given, positions outside it
are 0 and NaN/Inf there cannot leak into values or gradients; without it the estimate is
elementwise and the caller must mask before reducing.
"""

from __future__ import annotations

from typing import Callable

import torch

from credo.algos._validate import LOG_RATIO_CLAMP, as_bool_mask, check_like, check_tensor, masked_fill_zero, register

KL_ESTIMATORS: dict[str, Callable] = {}


def register_kl_estimator(name: str) -> Callable[[Callable], Callable]:
    """Decorator recording a KL estimator in :data:`KL_ESTIMATORS`."""
    return lambda fn: register(KL_ESTIMATORS, "KL estimator", name, fn)


def _log_ratio(log_probs, ref_log_probs, mask):
    check_tensor("log_probs", log_probs, floating=True)
    check_like("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    if mask is None:
        return (log_probs - ref_log_probs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), None
    m = as_bool_mask(mask, "log_probs", log_probs)
    d = masked_fill_zero(log_probs, m) - masked_fill_zero(ref_log_probs.detach(), m)
    return d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), m


def _finish(kl, m):
    return kl if m is None else masked_fill_zero(kl, m)


def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k1 = log pi - log pi_ref."""
    d, m = _log_ratio(log_probs, ref_log_probs, mask)
    return _finish(d, m)


k1 = register_kl_estimator("k1")(k1)


def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2."""
    d, m = _log_ratio(log_probs, ref_log_probs, mask)
    return _finish(0.5 * d * d, m)


k2 = register_kl_estimator("k2")(k2)


def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi), unclamped (only ``d`` is clamped to [-20, 20]).

    verl's ``kl_penalty: k3`` is its clamped ``low_var_kl``; the equivalent here is
    :func:`k3_clamped`. This one keeps the estimator unbiased at the cost of unbounded values
    when pi_ref gives a sampled token almost no mass.
    """
    d, m = _log_ratio(log_probs, ref_log_probs, mask)
    return _finish(torch.exp(-d) - 1 + d, m)


k3 = register_kl_estimator("k3")(k3)


def k3_clamped(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    max_value: float = 10.0,
) -> torch.Tensor:
    """k3 clamped to [-max_value, max_value] (verl ``low_var_kl``: log-ratio in [-20, 20], output in
    [-10, 10]); bounds the penalty when pi_ref assigns a sampled token almost no mass."""
    d, m = _log_ratio(log_probs, ref_log_probs, mask)
    return _finish((torch.exp(-d) - 1 + d).clamp(-max_value, max_value), m)


k3_clamped = register_kl_estimator("k3_clamped")(k3_clamped)
