"""Attention credit statistics of a whole padded batch at once (arXiv 2510.13554, 2606.10646).

:mod:`credo.credit.streaming` reduces one unpadded sequence at a time; called in a Python loop over
the 512 short sequences of a quickstart step, the loop's per-call overhead costs several times the
training step itself. The functions here take a batch whose real tokens are packed to the left
(:func:`pack_tokens`) and reduce every (sequence, head) pair together, still one block of query rows
at a time, so the memory stays bounded by ``scores_per_step`` attention scores per step, never
``[B, H, N, N]``.

Why packing makes padding harmless: after :func:`pack_tokens`, sequence ``b``'s ``n_b`` real tokens
sit at positions ``0 .. n_b - 1`` in their original order (left, right or scattered padding alike),
and its padding slots hold zero states. A real row ``t < n_b`` attends causally to keys ``s <= t``,
all real, so its softmax is the one of the unpadded sequence; rows ``t >= n_b`` are excluded from
every reduction by the response/validity masks (and their capacity rows are zeroed for the flow).
Positions are relative to each sequence's first real token, as in the per-sequence functions.
"""

from __future__ import annotations

import math

import torch

from credo.credit._select import top_fraction_mask
from credo.credit.streaming import _compute_dtype, _flatten_heads, _row_blocks

__all__ = ["pack_tokens", "batched_head_stats", "batched_flow_throughput", "group_heads_rows"]

DEFAULT_SCORES_PER_STEP = 1 << 22
"""Attention scores computed at once (4M: 16 MiB in float32, plus the softmax's temporaries)."""


def pack_tokens(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each sequence's real tokens go when packed to the left.

    Args:
        attention_mask: ``[B, N]``, nonzero on real tokens (padding anywhere).

    Returns:
        ``(index [B, n], valid [B, n])`` with ``n`` the longest sequence: ``index[b, j]`` is the
        original column of packed slot ``j`` (the real tokens in order, then padding columns), and
        ``valid[b, j]`` is True on the ``n_b`` real slots. ``x.gather(1, index)`` packs a ``[B, N]``
        tensor; ``out.scatter(1, index, packed)`` puts packed values back.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask has shape {list(attention_mask.shape)}, expected [B, N]")
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    width = int(lengths.max()) if real.numel() else 0
    # A stable sort of "is padding" keeps the real tokens first and in order.
    index = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=real.device)[None, :] < lengths[:, None]
    return index, valid


def _pairs_per_step(scores_per_step: int, block_size: int, n: int) -> int:
    if scores_per_step < 1:
        raise ValueError(f"scores_per_step={scores_per_step}, expected a positive int")
    return max(1, scores_per_step // max(1, min(block_size, n) * n))


def _scrub(q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the states of padding slots (they may hold NaN) unless there is no padding."""
    if bool(valid.all()):
        return q, k
    keep = valid[:, None, :, None]
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    return torch.where(keep, q, zero), torch.where(keep, k, zero)


def batched_head_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    window: int = 10,
    h_lo: int = 10,
    h_hi: int = 100,
    scale: float | None = None,
    block_size: int = 256,
    scores_per_step: int = DEFAULT_SCORES_PER_STEP,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head span, WAAD and FAI of one layer for a packed batch (arXiv 2510.13554, Eq. 7-10).

    For every sequence ``b``, equal (to float rounding) to
    :func:`credo.credit.streaming.streaming_head_stats` on its ``n_b`` real tokens, with
    ``response_mask[b, :n_b]``.

    Args:
        q: ``[B, H, n, d]`` packed query states (anything, even NaN, on padding slots).
        k: ``[B, H_kv, n, d]`` packed key states.
        valid: ``[B, n]`` bool real slots (from :func:`pack_tokens`).
        response_mask: ``[B, n]`` bool packed response tokens (False on padding slots is enforced).
        window: WAAD window ``W``.
        h_lo, h_hi: FAI horizon.
        scale: logit scale (default ``1 / sqrt(d)``).
        block_size: query rows per block.
        scores_per_step: scores computed together; sets how many (sequence, head) pairs a step takes.

    Returns:
        ``(span [B, H], waad [B, H, n], fai [B, H, n])`` in float32 (float64 for float64 input);
        0 on padding slots.
    """
    if q.dim() != 4:
        raise ValueError(f"q has shape {list(q.shape)}, expected [B, H, n, d]")
    batch, heads, n, d = q.shape
    _flatten_heads(q, k)  # validates the shapes
    for name, mask in (("valid", valid), ("response_mask", response_mask)):
        if tuple(mask.shape) != (batch, n):
            raise ValueError(f"{name} has shape {list(mask.shape)}, expected [{batch}, {n}] like q's [B, n]")
    if window < 0:
        raise ValueError(f"window={window}, expected a non-negative int")
    if not 0 <= h_lo <= h_hi:
        raise ValueError(f"h_lo={h_lo}, h_hi={h_hi}, expected 0 <= h_lo <= h_hi")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dtype, device = _compute_dtype(q), q.device
    valid = valid.bool()
    q, k = _scrub(q, k, valid)
    q_flat, k_flat, kv_index = _flatten_heads(q, k)
    response = response_mask.bool() & valid
    pair_response = response.to(dtype).repeat_interleave(heads, dim=0)  # [B*H, n]
    span_sum = torch.zeros(batch * heads, dtype=dtype, device=device)
    waad_rows = torch.zeros(batch * heads, n, dtype=dtype, device=device)
    fai_sum = torch.zeros(batch * heads, n, dtype=dtype, device=device)
    step = _pairs_per_step(scores_per_step, block_size, n)
    for r0, r1, ps, probs in _row_blocks(q_flat, k_flat, kv_index, scale, block_size, step):
        rows = torch.arange(r0, r1, device=device, dtype=dtype)
        ahead = rows[:, None] - torch.arange(r1, device=device, dtype=dtype)[None, :]  # t - s
        in_response = pair_response[ps, r0:r1]  # [P, rows]
        # Both distance-weighted row sums in one batched matmul over the block's rows.
        weights = torch.stack([ahead.clamp(min=0), ahead.clamp(min=0, max=window)], dim=-1)  # [rows, r1, 2]
        row_sums = torch.bmm(probs.transpose(0, 1), weights)  # [rows, P, 2]
        span_sum[ps] += (row_sums[..., 0].T * in_response).sum(dim=1)
        waad_rows[ps, r0:r1] = row_sums[..., 1].T
        horizon = ((ahead >= h_lo) & (ahead <= h_hi)).to(dtype)
        fai_sum[ps, :r1] += torch.bmm(in_response[:, None, :], probs * horizon)[:, 0]
    # |T(s)| = #response rows t in [s + h_lo, s + h_hi], from a prefix sum of each response mask.
    prefix = torch.cat([response.new_zeros(batch, 1, dtype=torch.long), response.long().cumsum(1)], dim=1)
    s = torch.arange(n, device=device)
    count = prefix[:, (s + h_hi + 1).clamp(max=n)] - prefix[:, (s + h_lo).clamp(max=n)]  # [B, n]
    fai_sum = fai_sum.view(batch, heads, n)
    fai_heads = torch.where(count[:, None] > 0, fai_sum / count[:, None].clamp(min=1), torch.zeros_like(fai_sum))
    span = span_sum.view(batch, heads) / response.sum(dim=1, keepdim=True).clamp(min=1)
    waad = torch.where(valid[:, None], waad_rows.view(batch, heads, n), torch.zeros((), dtype=dtype, device=device))
    return span, waad, torch.where(valid[:, None], fai_heads, torch.zeros((), dtype=dtype, device=device))


def group_heads_rows(span: torch.Tensor, quantile: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`credo.credit.attention.group_heads` of each row: ``span [B, P] -> (local, global) [B, P]``.

    Heads are ranked within each sequence over all ``P`` (layer, head) pairs, ties by column.
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile={quantile}, expected a value in (0, 1]")
    span = span.detach()
    valid = torch.ones_like(span, dtype=torch.bool)
    return (top_fraction_mask(span, valid, quantile, largest=False),
            top_fraction_mask(span, valid, quantile, largest=True))


def batched_flow_throughput(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor,
    question_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    edge_threshold: float = 0.0,
    normalize: bool = True,
    scale: float | None = None,
    block_size: int = 256,
    scores_per_step: int = DEFAULT_SCORES_PER_STEP,
) -> torch.Tensor:
    """FlowTracer throughput of a packed batch (arXiv 2606.10646), all sequences together.

    For every sequence ``b``, equal (to float rounding) to
    :func:`credo.credit.streaming.streaming_flow_throughput` on its ``n_b`` real tokens: the same
    three sweeps over row blocks (outgoing sums, potential ``h`` last block to first, flow first to
    last), with the block systems of all sequences solved as one batched triangular solve. Padding
    slots get no capacity (no edges in or out), no source and no sink, hence zero throughput.

    Args:
        q: ``[B, P, n, d]`` packed query states, ``P`` = all (layer, head) pairs to average
            (anything, even NaN, on padding slots).
        k: ``[B, P_kv, n, d]`` packed key states (``P`` a multiple of ``P_kv``, GQA per layer as in
            :func:`credo.credit.streaming.streaming_flow_throughput` on ``[L, H, n, d]``).
        valid: ``[B, n]`` bool real slots.
        question_mask, answer_mask: ``[B, n]`` bool packed question and answer tokens.
        edge_threshold, normalize: as in :func:`credo.credit.flow.flow_capacity`.
        scale: logit scale (default ``1 / sqrt(d)``).
        block_size: query rows per block.
        scores_per_step: scores computed together.

    Returns:
        ``[B, n]`` float64 throughput, 0 on padding slots.
    """
    if q.dim() != 4:
        raise ValueError(f"q has shape {list(q.shape)}, expected [B, P, n, d]")
    batch, heads, n, d = q.shape
    _flatten_heads(q, k)  # validates the shapes
    for name, mask in (("valid", valid), ("question_mask", question_mask), ("answer_mask", answer_mask)):
        if tuple(mask.shape) != (batch, n):
            raise ValueError(f"{name} has shape {list(mask.shape)}, expected [{batch}, {n}] like q's [B, n]")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    device, f64 = q.device, torch.float64
    valid = valid.bool()
    q, k = _scrub(q, k, valid)
    q_flat, k_flat, kv_index = _flatten_heads(q, k)
    question, answer = question_mask.bool() & valid, answer_mask.bool() & valid
    owner = torch.arange(batch, device=device).repeat_interleave(heads)  # pair -> sequence
    step = _pairs_per_step(scores_per_step, block_size, n)

    def capacity_blocks(reverse: bool):
        """Yield ``(r0, r1, C [B, r1 - r0, r1])``: the head-averaged, thresholded capacity rows."""
        total, current = None, None
        for r0, r1, ps, probs in _row_blocks(q_flat, k_flat, kv_index, scale, block_size, step, reverse=reverse):
            if current != r0:
                total, current = torch.zeros(batch, r1 - r0, r1, dtype=f64, device=device), r0
            total.index_add_(0, owner[ps], probs.to(f64))
            if ps.stop == batch * heads:
                mean = total / heads
                rows = torch.arange(r0, r1, device=device)
                past = torch.arange(r1, device=device)[None, :] < rows[:, None]
                keep = past & (mean >= edge_threshold) & valid[:, r0:r1, None]
                yield r0, r1, torch.where(keep, mean, torch.zeros((), dtype=f64, device=device))

    out_sum = torch.ones(batch, n, dtype=f64, device=device)
    if normalize:
        out_sum = torch.zeros(batch, n, dtype=f64, device=device)
        for _, r1, cap in capacity_blocks(reverse=False):
            out_sum[:, :r1] += cap.sum(dim=1)
    inv_out = torch.where(out_sum > 0, 1.0 / out_sum.clamp(min=1e-300), torch.zeros_like(out_sum))

    # Pass 2 (see streaming_flow_throughput): (I - D C_JJ^T) h_J = 1[Ans]_J + D r_J per sequence.
    spread = torch.where(answer, torch.zeros_like(inv_out), inv_out)
    potential = torch.zeros(batch, n, dtype=f64, device=device)
    reached = torch.zeros(batch, n, dtype=f64, device=device)
    for r0, r1, cap in capacity_blocks(reverse=True):
        inner = cap[:, :, r0:r1]
        eye = torch.eye(r1 - r0, dtype=f64, device=device)
        system = eye - spread[:, r0:r1, None] * inner.transpose(1, 2)
        rhs = answer[:, r0:r1].to(f64) + spread[:, r0:r1] * reached[:, r0:r1]
        h_block = torch.linalg.solve_triangular(system, rhs[..., None], upper=True)[..., 0]
        potential[:, r0:r1] = h_block
        reached[:, :r0] += torch.einsum("bk,bki->bi", h_block, cap[:, :, :r0])

    # Pass 3: (I - diag(h_J) C_JJ diag(e_J)) f_J = src_J + h_J * C_J,<J u_<J.
    live = (~answer) & (potential > 0)
    push = torch.where(live, inv_out / potential.clamp(min=1e-300), torch.zeros_like(potential))
    question = question & (potential > 0)
    source = question.to(f64) / question.sum(dim=1, keepdim=True).clamp(min=1)
    flow = torch.zeros(batch, n, dtype=f64, device=device)
    pushed = torch.zeros(batch, n, dtype=f64, device=device)
    for r0, r1, cap in capacity_blocks(reverse=False):
        inner = cap[:, :, r0:r1]
        h_block = potential[:, r0:r1]
        eye = torch.eye(r1 - r0, dtype=f64, device=device)
        system = eye - h_block[:, :, None] * inner * push[:, None, r0:r1]
        rhs = source[:, r0:r1] + h_block * torch.einsum("bki,bi->bk", cap[:, :, :r0], pushed[:, :r0])
        f_block = torch.linalg.solve_triangular(system, rhs[..., None], upper=False)[..., 0]
        flow[:, r0:r1] = f_block
        pushed[:, r0:r1] = push[:, r0:r1] * f_block
    return flow
