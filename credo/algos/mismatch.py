"""Diagnostics of the train/inference mismatch between the trainer ``pi`` and the sampler ``mu``.

MIPU (arXiv 2606.29526, Sec. 5 "diagnostics") logs the K3-KL between the inference policy ``mu``
(e.g. an FP8 vLLM engine) and the training policy ``pi`` on the rollout tokens; the quantiles,
effective sample size and maximum of the token ratio show how heavy the tail of the importance
weights ``pi / mu`` is (what truncation at ``w_max`` cuts off).
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
)

MISMATCH_METRICS = (
    "mismatch/k3",
    "mismatch/log_ratio_p1",
    "mismatch/log_ratio_p50",
    "mismatch/log_ratio_p99",
    "mismatch/ess",
    "mismatch/max_ratio",
)


def mismatch_metrics(
    trainer_log_probs: torch.Tensor, sampler_log_probs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Summary of the token ratio ``r_t = pi(a_t) / mu(a_t)`` on the rollout tokens.

    Tokens ``a_t`` are sampled from ``mu``, so with ``d_t = log pi(a_t) - log mu(a_t)``:

    - ``mismatch/k3``: mean over masked tokens of ``r_t - 1 - d_t``, the k3 estimator
      (Schulman 2020) of **KL(mu || pi)** from samples of ``mu`` (unbiased, >= 0).
    - ``mismatch/log_ratio_p1``, ``_p50``, ``_p99``: quantiles of ``d_t`` (linear interpolation
      between order statistics, as ``numpy.percentile``'s default).
    - ``mismatch/ess``: *normalised* effective sample size of the token weights ``r_t``,
      ``(sum r)^2 / (n sum r^2)`` in ``(0, 1]`` (1 when all weights are equal).
    - ``mismatch/max_ratio``: ``max_t r_t``.

    Computed in float64 without gradient. ``r_t`` uses ``d_t`` clamped to [-20, 20], like the
    losses (so ``max_ratio`` is at most e^20 and every value is finite); the quantiles use the
    unclamped ``d_t``. An empty mask gives NaN for every metric.

    Args:
        trainer_log_probs: ``[B, T]`` log pi of the sampled tokens (the trainer's recomputation).
        sampler_log_probs: ``[B, T]`` log mu of the same tokens (the inference engine).
        mask: ``[B, T]`` bool or 0/1 floating, True on rollout (response) tokens.

    Returns:
        ``{name: float}`` with the keys of :data:`MISMATCH_METRICS`.

    Raises:
        ValueError: wrong shapes/dtypes (naming the argument) or NaN/Inf at masked-in positions.
    """
    check_tensor("trainer_log_probs", trainer_log_probs, ndim=2, floating=True)
    check_like("sampler_log_probs", sampler_log_probs, "trainer_log_probs", trainer_log_probs)
    m = as_bool_mask(mask, "trainer_log_probs", trainer_log_probs)
    check_finite("trainer_log_probs", trainer_log_probs, m)
    check_finite("sampler_log_probs", sampler_log_probs, m)
    if not bool(m.any()):
        return {name: math.nan for name in MISMATCH_METRICS}
    with torch.no_grad():
        d = (masked_fill_zero(trainer_log_probs, m) - masked_fill_zero(sampler_log_probs, m)).double()[m]
        clamped = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = clamped.exp()
        n = d.numel()
        p1, p50, p99 = (_quantile_sorted(torch.sort(d).values, q) for q in (0.01, 0.5, 0.99))
        return {
            "mismatch/k3": float((ratio - 1 - clamped).mean()),
            "mismatch/log_ratio_p1": p1,
            "mismatch/log_ratio_p50": p50,
            "mismatch/log_ratio_p99": p99,
            "mismatch/ess": float(ratio.sum() ** 2 / (n * (ratio * ratio).sum())),
            "mismatch/max_ratio": float(ratio.max()),
        }


def _quantile_sorted(values: torch.Tensor, q: float) -> float:
    """Linear-interpolation quantile of sorted 1-D ``values`` (no size limit, unlike
    ``torch.quantile``, which refuses inputs above 2^24 elements)."""
    pos = q * (values.numel() - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, values.numel() - 1)
    frac = pos - lo
    return float(values[lo] + frac * (values[hi] - values[lo]))
