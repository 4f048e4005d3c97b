"""Loss aggregation over tokens and sequences, invariant to micro-batch and data-parallel splits.

Mode names follow the shared vocabulary of verl / ROLL / OpenRLHF (``loss_agg_mode``). Token-level
aggregation is the Lite PPO recommendation (arXiv 2508.08221, Eq. "token-mean"); the constant
normaliser of ``seq-mean-token-sum-norm`` is Dr. GRPO's (arXiv 2503.20783).

Split invariance rule: compute ``global_tokens`` / ``global_seqs`` once over the whole batch (all
micro-batches, all data-parallel ranks; :func:`global_counts` gives the local terms to all-reduce)
and pass them to every call. Then the per-micro-batch losses *sum* to the full-batch loss, with the
same gradients. Without them each call normalises by its own local counts (a mean).

Precision: sums and counts are formed in float32 or wider (:func:`accumulation_dtype`). A count
cast to float16 overflows above 65,504 (the loss would silently be 0) and one cast to bfloat16
rounds to 8 significant bits (3000 becomes 3008), so half-precision values are upcast to float32
before summing and the result is float32; float32 and float64 values are reduced in their own dtype.
"""

from __future__ import annotations

import torch

from credo.algos._validate import as_bool_mask, check_choice, check_positive, check_tensor, masked_fill_zero

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def global_counts(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Local token and sequence counts to sum (all-reduce) across micro-batches and ranks.

    Args:
        mask: ``[B, T]`` bool or 0/1 float, True on tokens that enter the loss.

    Returns:
        ``(tokens, seqs)``: int64 0-d tensors. ``tokens`` is the number of masked-in tokens;
        ``seqs`` the number of sequences with at least one masked-in token (empty sequences are
        not counted, see :func:`aggregate`).
    """
    check_tensor("mask", mask, ndim=2)
    m = as_bool_mask(mask, "mask", mask)
    return m.sum(), (m.sum(-1) > 0).sum()


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums and counts are formed in: ``dtype`` promoted to at least float32
    (float16/bfloat16 -> float32; float32 and float64 unchanged)."""
    return torch.promote_types(dtype, torch.float32)


def _denominator(count, local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    c = local if count is None else torch.as_tensor(count, device=like.device)
    return c.to(like.dtype).clamp_min(1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_tokens=None,
    global_seqs=None,
    norm_len: int | float | None = None,
) -> torch.Tensor:
    """Reduces a per-token quantity to a scalar.

    With ``m`` the mask, ``n_i = sum_t m_it`` and ``N_tok``/``N_seq`` the token/sequence counts
    (global when given, else local):

    - ``token-mean``:               ``sum_{i,t} m_it v_it / N_tok``
    - ``seq-mean-token-mean``:      ``sum_i (sum_t m_it v_it / n_i) / N_seq``
    - ``seq-mean-token-sum``:       ``sum_i sum_t m_it v_it / N_seq``
    - ``seq-mean-token-sum-norm``:  ``sum_i sum_t m_it v_it / (norm_len * N_seq)`` (Dr. GRPO)

    Empty sequences (``n_i = 0``) contribute 0 and are not counted in ``N_seq``: a sequence masked
    out entirely (overlong filtering, rejection) leaves the loss as if it were not in the batch.
    Locally ``N_seq`` is the number of non-empty rows; ``global_seqs`` must count the same thing
    (:func:`global_counts`). Counts are clamped to at least 1, so an all-zero mask gives 0.

    ``seq-mean-token-sum-norm`` divides by a constant ``norm_len`` (default: ``T``, the padded
    length of ``values``). When micro-batches are padded to different lengths, pass ``norm_len``
    explicitly (e.g. the maximum response length) or the result depends on the padding. Note:
    verl/ROLL's mode of the same name omits the ``1 / N_seq`` factor (their value is ours times
    ``N_seq``); ours follows the Dr. GRPO paper's ``1/G`` average over responses.

    Masked-out positions of ``values`` may hold NaN/Inf: they are removed with ``torch.where`` and
    leak into neither the result nor its gradient.

    Sums and counts are in :func:`accumulation_dtype` of ``values``: float16/bfloat16 values are
    upcast to float32 first (a half-precision count overflows at 65,504 or rounds: bf16 holds 3008
    for 3000), so the result is float32 for them and the dtype of ``values`` otherwise. The gradient
    reaching ``values`` is cast back to their dtype by autograd.

    Args:
        values: ``[B, T]`` floating per-token values (e.g. a per-token loss).
        mask: ``[B, T]`` bool or 0/1 floating.
        mode: one of :data:`AGG_MODES`.
        global_tokens: total masked-in tokens over all micro-batches/ranks (int or 0-d tensor).
        global_seqs: total non-empty sequences over all micro-batches/ranks (int or 0-d tensor).
        norm_len: the constant of ``seq-mean-token-sum-norm``; ignored by the other modes.

    Returns:
        A 0-d tensor, float32 for float16/bfloat16 ``values``, else in the dtype of ``values``.
    """
    check_tensor("values", values, ndim=2, floating=True)
    m = as_bool_mask(mask, "values", values)
    check_choice("mode", mode, AGG_MODES)
    check_positive("global_tokens", global_tokens, allow_none=True)
    check_positive("global_seqs", global_seqs, allow_none=True)
    check_positive("norm_len", norm_len, allow_none=True)
    v = masked_fill_zero(values, m).to(accumulation_dtype(values.dtype))  # a no-op for float32/64
    if mode == "token-mean":
        return v.sum() / _denominator(global_tokens, m.sum(), v)
    token_sum = v.sum(-1)
    n_tok = m.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = token_sum / n_tok.clamp_min(1).to(v.dtype)
    elif mode == "seq-mean-token-sum":
        per_seq = token_sum
    else:
        per_seq = token_sum / float(values.shape[-1] if norm_len is None else norm_len)
    return per_seq.sum() / _denominator(global_seqs, (n_tok > 0).sum(), v)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (0 for an empty mask); for metrics, no validation.

    Summed and divided in :func:`accumulation_dtype` of ``values`` (float32 for float16/bfloat16
    values, as :func:`aggregate`), which is also the dtype of the 0-d result.
    """
    v = masked_fill_zero(values, mask).to(accumulation_dtype(values.dtype))
    return v.sum() / mask.sum().clamp_min(1).to(v.dtype)
