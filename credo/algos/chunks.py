"""Chunk primitives of the IPA policy loss (arXiv 2512.24873): chunk ids, chunk means, the
geometric chunk ratio and the chunk train/inference mismatch mask.

A *chunk* is a maximal run of 1s in a sample's response mask: one model-generated span between two
environment interactions. Observation/tool tokens carry mask 0 and separate the chunks. They live
in :mod:`credo.algos` because the ``"ipa"`` loss (:mod:`credo.algos.ipa`) needs them and
``credo.algos`` imports nothing from :mod:`credo.credit`; :mod:`credo.credit.chunks` re-exports
them next to the chunk returns (the credit-assignment side).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "chunk_ids",
    "num_chunks",
    "chunk_mean",
    "chunk_to_tokens",
    "chunk_ratio",
    "chunk_mismatch_mask",
]


def _check_2d(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {list(x.shape)}, expected [B, T]")


def _check_like(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {list(x.shape)}, expected {list(ref.shape)} like {ref_name}"
        )


def chunk_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """Index every token by the chunk it belongs to.

    A chunk is a maximal contiguous run of 1s in ``response_mask`` (arXiv 2512.24873, Sec. 3.2.4,
    "chunked MDP"); observation tokens (mask 0) separate chunks.

    Args:
        response_mask: ``[B, T]`` bool or 0/1 tensor, 1 on model-generated tokens.

    Returns:
        ``[B, T]`` int64: chunk index ``0..K_b-1`` within sample ``b`` (in time order), ``-1``
        outside the response.
    """
    _check_2d("response_mask", response_mask)
    mask = response_mask.bool()
    previous = torch.zeros_like(mask)
    previous[:, 1:] = mask[:, :-1]
    starts = mask & ~previous
    ids = starts.long().cumsum(dim=-1) - 1
    return torch.where(mask, ids, torch.full_like(ids, -1))


def num_chunks(chunk_ids: torch.Tensor) -> torch.Tensor:
    """Number of chunks ``K_b`` per sample: ``[B, T]`` chunk ids -> ``[B]`` int64 (0 if none)."""
    _check_2d("chunk_ids", chunk_ids)
    if chunk_ids.shape[1] == 0:
        return torch.zeros(chunk_ids.shape[0], dtype=torch.long, device=chunk_ids.device)
    return (chunk_ids.max(dim=-1).values + 1).clamp(min=0)


def chunk_mean(
    values: torch.Tensor, chunk_ids: torch.Tensor, max_chunks: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` over each chunk.

    Tokens outside any chunk are ignored even when they hold NaN/Inf (they are replaced by 0 with
    ``torch.where`` before summing, so nothing leaks into the sums or their gradients).

    Args:
        values: ``[B, T]`` float.
        chunk_ids: ``[B, T]`` int from :func:`chunk_ids`.
        max_chunks: number of chunk slots ``K`` in the output (default: the largest ``K_b``).

    Returns:
        ``(means, counts)``, both ``[B, K]``: the chunk means (0 for empty slots) and the chunk
        lengths ``|c|``.
    """
    _check_2d("values", values)
    _check_like("chunk_ids", chunk_ids, "values", values)
    if max_chunks is None:
        max_chunks = int(num_chunks(chunk_ids).max().item()) if values.shape[0] else 0
    inside = chunk_ids >= 0
    # Slot max_chunks collects everything outside the response and is dropped afterwards.
    slot = torch.where(inside, chunk_ids, torch.full_like(chunk_ids, max_chunks))
    # an index equal to max_chunks would land in the outside slot and be dropped silently
    if (inside & (chunk_ids >= max_chunks)).any():
        raise ValueError(f"chunk_ids holds a chunk index >= max_chunks={max_chunks}")
    safe = torch.where(inside, values, torch.zeros_like(values))
    sums = safe.new_zeros(values.shape[0], max_chunks + 1).scatter_add(1, slot, safe)
    counts = values.new_zeros(values.shape[0], max_chunks + 1).scatter_add(
        1, slot, inside.to(values.dtype)
    )
    sums, counts = sums[:, :max_chunks], counts[:, :max_chunks]
    means = sums / counts.clamp(min=1)
    return means, counts


def chunk_to_tokens(per_chunk: torch.Tensor, chunk_ids: torch.Tensor, fill: float) -> torch.Tensor:
    """Broadcast ``[B, K]`` per-chunk values to the ``[B, T]`` tokens of each chunk.

    Args:
        per_chunk: ``[B, K]`` value of chunk ``k`` of sample ``b``.
        chunk_ids: ``[B, T]`` from :func:`chunk_ids` (every id ``< K``).
        fill: value of the tokens outside every chunk (``chunk_ids == -1``).

    Returns:
        ``[B, T]`` in the dtype of ``per_chunk``.
    """
    _check_2d("per_chunk", per_chunk)
    _check_2d("chunk_ids", chunk_ids)
    if per_chunk.shape[1] == 0:
        return torch.full(chunk_ids.shape, fill, dtype=per_chunk.dtype, device=per_chunk.device)
    gathered = per_chunk.gather(1, chunk_ids.clamp(min=0))
    return torch.where(chunk_ids >= 0, gathered, torch.full_like(gathered, fill))


def chunk_ratio(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    chunk_ids: torch.Tensor,
    *,
    max_log_ratio: float = 20.0,
) -> torch.Tensor:
    """Chunk-level importance ratio, the geometric mean of token ratios (arXiv 2512.24873, Eq. 8).

        rho_c = (prod_{t in c} pi(t) / pi_old(t))^(1/|c|) = exp(mean_{t in c} [log pi - log pi_old])

    The mean log-ratio is clamped to ``[-max_log_ratio, max_log_ratio]`` before ``exp`` so the
    ratio stays finite in float32/bf16 (e^20 ~ 4.9e8); inside the band the value and gradient are
    exact, outside the gradient is zero (as with any clamp). ROLL does not clamp; the clamp only
    matters for pathological inputs.

    Args:
        log_probs: ``[B, T]`` current-policy log-probs (may carry gradient).
        old_log_probs: ``[B, T]`` behaviour-policy log-probs.
        chunk_ids: ``[B, T]`` from :func:`chunk_ids`.
        max_log_ratio: clamp for the mean log-ratio.

    Returns:
        ``[B, T]`` ratio ``rho_c`` on every token of chunk ``c``, 1 outside the response.
    """
    _check_2d("log_probs", log_probs)
    _check_like("old_log_probs", old_log_probs, "log_probs", log_probs)
    _check_like("chunk_ids", chunk_ids, "log_probs", log_probs)
    inside = chunk_ids >= 0
    log_ratio = torch.where(inside, log_probs, 0.0) - torch.where(inside, old_log_probs, 0.0)
    mean_log_ratio, _ = chunk_mean(log_ratio, chunk_ids)
    ratio = mean_log_ratio.clamp(-max_log_ratio, max_log_ratio).exp()
    return chunk_to_tokens(ratio, chunk_ids, 1.0)


def chunk_mismatch_mask(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    chunk_ids: torch.Tensor,
    ratio_low: float | None = 0.8,
    ratio_high: float | None = 1.2,
    diff_low: float | None = None,
    diff_high: float | None = None,
) -> torch.Tensor:
    """Keep-mask that drops whole chunks with a large train/inference mismatch (IPA Sec. 3.3).

    A chunk is kept iff

        ratio_low <= exp(mean_c(log pi_old^train - log mu_old^infer)) <= ratio_high
        and (if given) diff_low <= mean_c(pi_old^train - mu_old^infer) <= diff_high

    The paper states the one-sided ``<= H`` form (``ratio_low=None``); the two-sided band and the
    probability-difference band are ROLL's ``train_infer_correction`` generalisation (its dataclass
    defaults are ratio 0.8..1.2, diff -0.2..0.2; its example config 0.8..1.05, -0.1..0.1). The ratio
    test is done on the mean log-ratio against ``log(ratio_low)``, ``log(ratio_high)`` so it cannot
    overflow. A chunk whose mean is NaN fails every test and is dropped.

    Args:
        old_log_probs: ``[B, T]`` behaviour log-probs recomputed by the trainer.
        rollout_log_probs: ``[B, T]`` log-probs reported by the inference engine.
        chunk_ids: ``[B, T]`` from :func:`chunk_ids`.
        ratio_low, ratio_high: band for the geometric-mean ratio; ``None`` = unbounded side.
        diff_low, diff_high: band for the mean probability difference; ``None`` = unbounded side.

    Returns:
        ``[B, T]`` bool: True on tokens of kept chunks, False on dropped chunks and outside the
        response.
    """
    _check_2d("old_log_probs", old_log_probs)
    _check_like("rollout_log_probs", rollout_log_probs, "old_log_probs", old_log_probs)
    _check_like("chunk_ids", chunk_ids, "old_log_probs", old_log_probs)
    for name, value in (("ratio_low", ratio_low), ("ratio_high", ratio_high)):
        if value is not None and value < 0:
            raise ValueError(f"{name}={value}, expected a non-negative ratio bound or None")
    inside = chunk_ids >= 0
    old = torch.where(inside, old_log_probs.detach(), 0.0)
    rollout = torch.where(inside, rollout_log_probs.detach(), 0.0)
    mean_log_ratio, _ = chunk_mean(old - rollout, chunk_ids)
    keep = ~torch.isnan(mean_log_ratio)
    if ratio_low is not None:
        low = math.log(ratio_low) if ratio_low > 0 else -math.inf
        keep &= mean_log_ratio >= low
    if ratio_high is not None:
        high = math.log(ratio_high) if ratio_high > 0 else -math.inf
        keep &= mean_log_ratio <= high
    if diff_low is not None or diff_high is not None:
        mean_diff, _ = chunk_mean(old.exp() - rollout.exp(), chunk_ids)
        keep &= ~torch.isnan(mean_diff)
        if diff_low is not None:
            keep &= mean_diff >= diff_low
        if diff_high is not None:
            keep &= mean_diff <= diff_high
    return chunk_to_tokens(keep, chunk_ids, False)
