"""IPA: chunk-level policy optimisation for agents (Interaction-Perceptive Agentic Policy
Optimization, "Let It Flow", arXiv 2512.24873).

Registers the policy loss ``"ipa"`` in :data:`credo.algos.POLICY_LOSSES`, so importing
:mod:`credo.algos` alone makes it available to recipes. The chunk primitives it uses (chunk ids,
geometric chunk ratio, chunk mismatch mask) are in :mod:`credo.algos.chunks`; the chunk-level
returns that feed it as advantages are credit assignment and live in :mod:`credo.credit.chunks`.
:mod:`credo.credit` re-exports :func:`ipa_loss` (``credo.credit.ipa_loss``).
"""

from __future__ import annotations

import torch

from credo.algos._validate import check_like
from credo.algos.policy_losses import _frac, per_token_policy_loss, ratio_summary, register_policy_loss
from credo.algos import chunks as _chunks
from credo.algos.chunks import chunk_mean, chunk_mismatch_mask, chunk_ratio

__all__ = ["ipa_loss"]


def ipa_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor | None = None,
    chunk_ids: torch.Tensor | None = None,
    ratio_low: float | None = 0.8,
    ratio_high: float | None = 1.2,
    diff_low: float | None = None,
    diff_high: float | None = None,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    max_log_ratio: float = 20.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IPA chunk-level TOPR policy loss (arXiv 2512.24873, Eq. 8-9 and Sec. 3.3).

    With ``rho_c = exp(mean_{t in c} (log pi - log pi_old))`` (:func:`chunk_ratio`) and
    ``m_c`` the chunk mismatch mask (:func:`chunk_mismatch_mask`, only when
    ``rollout_log_probs`` is given), the per-token loss (minimised) is::

        A_t > 0:   l_t = -m_c * w_+ * A_t * log pi(a_t)                       (weighted SL)
        A_t <= 0:  l_t = -m_c * w_- * sg[clip(rho_c, 0, 1)] * A_t * log pi(a_t) (truncated IS)

    times ``weights`` and the optional ``correction`` weight, then aggregated over ``mask`` with
    ``agg_mode``. This is ROLL's ``pg_variant: topr`` with ``ratio_type: segment`` plus its
    segment-level train/infer filter. The advantage is the chunk return (:func:`credo.credit.chunk_returns`,
    possibly group-normalised); its sign is read per token, which equals the paper's per-chunk
    ``G_c > 0`` test when advantages are constant over each chunk.

    Dropped chunks contribute 0 but stay in the aggregation denominator (as rejected tokens do in
    :func:`credo.algos.corrections.train_infer_correction`), so ``global_tokens``/``global_seqs``
    counted from ``mask`` keep the loss invariant to micro-batch and data-parallel splits.

    Args:
        log_probs: ``[B, T]`` log pi_theta of the sampled tokens (with grad).
        old_log_probs: ``[B, T]`` log pi_old (trainer recomputation).
        advantages: ``[B, T]`` chunk returns or advantages.
        mask: ``[B, T]`` bool or 0/1 floating, 1 on model-generated tokens.
        chunk_ids: ``[B, T]`` chunk index of every token (:func:`chunk_ids`); derived from ``mask``
            when None. Must be ``>= 0`` wherever ``mask`` is set.
        rollout_log_probs: ``[B, T]`` log mu of the inference engine. When given, chunks outside
            the mismatch band are dropped.
        ratio_low, ratio_high: band of the chunk's geometric train/infer ratio (ROLL dataclass
            defaults 0.8 / 1.2; the paper's one-sided ``H`` is ``ratio_low=None, ratio_high=H``).
        diff_low, diff_high: optional band of the chunk's mean probability difference.
        positive_weight, negative_weight: TOPR's ``w_+``, ``w_-`` (1.0 in ROLL and the paper).
        max_log_ratio: clamp of the chunk mean log-ratio before ``exp``.
        weights: ``[B, T]`` per-token multipliers (e.g. :func:`credo.credit.rhythm_gamma`).
        correction, correction_level, correction_cap, correction_low, correction_high: optional
            extra train/infer weight, see :func:`credo.algos.corrections.train_infer_correction`.
        agg_mode, global_tokens, global_seqs, norm_len: see
            :func:`credo.algos.aggregation.aggregate`.

    Returns:
        ``(loss, metrics)``: 0-d loss; metrics (0-d tensors) ``positive_frac`` (masked tokens with
        ``A > 0``), ``truncated_frac`` (masked tokens with ``A <= 0`` and ``rho_c > 1``),
        ``chunk_masked_frac`` (masked tokens in dropped chunks), ``chunk_dropped_frac`` (dropped
        chunks among chunks with a masked token), ``ratio_mean/max/min`` (``rho_c`` over masked
        tokens, 1 for an empty mask), plus the correction metrics when ``rollout_log_probs`` is
        given.

    Raises:
        ValueError: wrong shapes (naming the argument), NaN/Inf in masked-in positions, masked
            tokens without a chunk, or ``correction`` without ``rollout_log_probs``.
    """
    # per_token_policy_loss has validated the tensors, made `mask` bool and zeroed everything outside it;
    # it applies `weights` and `correction` and aggregates what this returns
    m, lp, old, adv = mask, log_probs, old_log_probs, advantages
    if chunk_ids is None:
        ids = _chunks.chunk_ids(m)
    else:
        check_like("chunk_ids", chunk_ids, "log_probs", log_probs, floating=False)
        if bool((m & (chunk_ids < 0)).any()):
            raise ValueError("chunk_ids is -1 on a masked-in token, expected a chunk index >= 0")
        ids = chunk_ids
    ids = torch.where(m, ids, torch.full_like(ids, -1))  # chunks only count masked-in tokens

    ratio = chunk_ratio(lp.detach(), old, ids, max_log_ratio=max_log_ratio)
    positive = adv > 0
    coef = torch.where(positive, positive_weight, negative_weight * ratio.clamp(0.0, 1.0))
    keep = m
    if rollout_log_probs is not None:
        keep = chunk_mismatch_mask(old, rollout_log_probs, ids, ratio_low, ratio_high, diff_low, diff_high)
    token_loss = torch.where(keep, -coef * adv * lp, torch.zeros((), dtype=lp.dtype, device=lp.device))

    with torch.no_grad():
        dropped = m & ~keep
        dropped_share, chunk_len = chunk_mean(dropped.to(lp.dtype), ids)
        chunk_has_token = chunk_len > 0
        metrics = {
            "positive_frac": _frac(positive, m),
            "truncated_frac": _frac(~positive & (ratio > 1), m),
            "chunk_masked_frac": _frac(dropped, m),
            "chunk_dropped_frac": ((dropped_share > 0) & chunk_has_token).sum().float()
            / chunk_has_token.sum().clamp(min=1).float(),
            **ratio_summary(ratio, m),
        }
    return token_loss, metrics


ipa_loss = register_policy_loss("ipa")(per_token_policy_loss(ipa_loss))
