"""Attention credit without materialising attention maps (arXiv 2510.13554, 2606.10646).

An eager attention map is ``N x N`` per head per layer: 16 heads at ``N = 4096`` are 1 GiB in
float32. The functions here recompute ``softmax(q k^T * scale + causal)`` one block of query rows at
a time from a layer's query and key states and reduce each block on the spot, so the extra memory is
``O(heads_per_step * block_size * N)`` plus ``O(H * N)`` outputs, never ``O(H * N^2)``.

- :func:`streaming_head_stats` gives, per head, everything :mod:`credo.credit.attention` needs:
  head span, WAAD and FAI. WAAD and FAI are linear in the map, so the mean over a head group of the
  per-head values equals WAAD/FAI of the group's mean map.
- :func:`streaming_flow_throughput` gives the FlowTracer throughput. The flow needs the
  head-averaged map only through row-block products, so it never holds an ``N x N`` matrix: a
  forward pass for the outgoing capacity sums (when normalising), a reverse pass for the
  potential ``h`` (the column sums it needs are accumulated from each row block), a forward pass
  for the flow. Each pass recomputes the attention blocks (up to 3x the QK^T compute of one
  forward).

``q`` and ``k`` are the states that enter the softmax (after RoPE/normalisation). Pass one sequence
without padding. Grouped-query attention: query head ``h`` uses key head ``h // (H // H_kv)``, the
``repeat_kv`` convention of Llama/Qwen.
"""

from __future__ import annotations

import math

import torch

from credo.credit._select import response_rows
from credo.credit.flow import _check_token_mask

__all__ = ["attention_from_qk", "streaming_head_stats", "streaming_flow_throughput"]


def _flatten_heads(
    q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten leading dims to heads and map every query head to its key head (GQA)."""
    if q.dim() < 3 or k.dim() != q.dim():
        raise ValueError(
            f"q has shape {list(q.shape)} and k {list(k.shape)}, expected [..., H, N, d] and "
            "[..., H_kv, N, d] with the same number of dimensions"
        )
    if q.shape[:-3] != k.shape[:-3] or q.shape[-2:] != k.shape[-2:]:
        raise ValueError(
            f"k has shape {list(k.shape)}, expected [..., H_kv, {q.shape[-2]}, {q.shape[-1]}] "
            f"with leading dims {list(q.shape[:-3])} like q"
        )
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q has {heads} heads and k {kv_heads}; expected H a multiple of H_kv")
    n, d = q.shape[-2:]
    lead = math.prod(q.shape[:-3])
    head = torch.arange(lead * heads, device=q.device)
    kv_index = (head // heads) * kv_heads + (head % heads) // (heads // kv_heads)
    return q.reshape(-1, n, d), k.reshape(-1, n, d), kv_index


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.promote_types(q.dtype, torch.float32)


def attention_from_qk(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Dense causal maps ``softmax(q k^T * scale + causal)``: the reference for this module.

    Args:
        q: ``[..., H, N, d]`` query states.
        k: ``[..., H_kv, N, d]`` key states, ``H`` a multiple of ``H_kv``.
        scale: logit scale (default ``1 / sqrt(d)``).

    Returns:
        ``[..., H, N, N]`` maps in float32 (float64 if ``q`` is float64).
    """
    q_flat, k_flat, kv_index = _flatten_heads(q, k)
    n, d = q.shape[-2:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dtype = _compute_dtype(q)
    scores = torch.matmul(q_flat.to(dtype), k_flat[kv_index].to(dtype).transpose(-1, -2)) * scale
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(diagonal=1)
    scores = scores.masked_fill(future, -math.inf)
    return torch.softmax(scores, dim=-1).reshape(*q.shape[:-1], n)


def _row_blocks(
    q_flat: torch.Tensor,
    k_flat: torch.Tensor,
    kv_index: torch.Tensor,
    scale: float,
    block_size: int,
    heads_per_step: int,
    reverse: bool = False,
):
    """Yield ``(r0, r1, heads, probs)``: softmax rows ``r0:r1`` (keys ``0:r1``) of some heads.

    ``probs`` is ``[len(heads), r1 - r0, r1]``. Only keys up to ``r1`` are scored: the rest are
    masked by causality anyway.
    """
    if block_size < 1 or heads_per_step < 1:
        raise ValueError(
            f"block_size={block_size}, heads_per_step={heads_per_step}, expected positive ints"
        )
    n = q_flat.shape[-2]
    dtype = _compute_dtype(q_flat)
    starts = list(range(0, n, block_size))
    for r0 in reversed(starts) if reverse else starts:
        r1 = min(n, r0 + block_size)
        rows = torch.arange(r0, r1, device=q_flat.device)
        future = torch.arange(r1, device=q_flat.device)[None, :] > rows[:, None]
        for h0 in range(0, q_flat.shape[0], heads_per_step):
            heads = slice(h0, min(q_flat.shape[0], h0 + heads_per_step))
            qb = q_flat[heads, r0:r1].to(dtype)
            kb = k_flat[kv_index[heads], :r1].to(dtype)
            scores = torch.matmul(qb, kb.transpose(-1, -2)) * scale
            scores.masked_fill_(future, -math.inf)
            yield r0, r1, heads, torch.softmax(scores, dim=-1)


def streaming_head_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    response_mask: torch.Tensor | None = None,
    window: int = 10,
    h_lo: int = 10,
    h_hi: int = 100,
    scale: float | None = None,
    block_size: int = 256,
    heads_per_step: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head span, WAAD and FAI of one layer from its query/key states (arXiv 2510.13554).

    Equal (to float rounding) to :func:`credo.credit.attention.head_span`,
    :func:`~credo.credit.attention.waad` and :func:`~credo.credit.attention.fai` applied to each
    head's map from :func:`attention_from_qk`. To use several layers, stack the outputs, group the
    heads with :func:`credo.credit.attention.group_heads`, and average WAAD over the local heads and
    FAI over the global heads.

    Args:
        q: ``[H, N, d]`` (or ``[L, H, N, d]``) query states.
        k: ``[H_kv, N, d]`` (or ``[L, H_kv, N, d]``) key states.
        response_mask: ``[N]`` bool response rows (all when None).
        window: WAAD window ``W``.
        h_lo, h_hi: FAI horizon.
        scale: logit scale (default ``1 / sqrt(d)``).
        block_size: query rows per block.
        heads_per_step: heads scored together (memory ``heads_per_step * block_size * N``).

    Returns:
        ``(span, waad, fai)``: ``span`` is ``[H]`` (0 if the response is empty), ``waad`` and
        ``fai`` are ``[H, N]`` (leading ``L`` kept if given); float32 (float64 for float64 input).
    """
    q_flat, k_flat, kv_index = _flatten_heads(q, k)
    n, d = q.shape[-2:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if window < 0:
        raise ValueError(f"window={window}, expected a non-negative int")
    if not 0 <= h_lo <= h_hi:
        raise ValueError(f"h_lo={h_lo}, h_hi={h_hi}, expected 0 <= h_lo <= h_hi")
    response = response_rows(response_mask, torch.Size([n]), q.device)
    dtype = _compute_dtype(q)
    heads = q_flat.shape[0]
    span_sum = torch.zeros(heads, dtype=dtype, device=q.device)
    waad_rows = torch.zeros(heads, n, dtype=dtype, device=q.device)
    fai_sum = torch.zeros(heads, n, dtype=dtype, device=q.device)
    blocks = _row_blocks(q_flat, k_flat, kv_index, scale, block_size, heads_per_step)
    for r0, r1, hs, probs in blocks:
        rows = torch.arange(r0, r1, device=q.device, dtype=dtype)
        ahead = rows[:, None] - torch.arange(r1, device=q.device, dtype=dtype)[None, :]  # t - s
        in_response = response[r0:r1].to(dtype)
        span_sum[hs] += (probs * ahead.clamp(min=0)).sum(dim=-1) @ in_response
        waad_rows[hs, r0:r1] = (probs * ahead.clamp(min=0, max=window)).sum(dim=-1)
        band = (ahead >= h_lo) & (ahead <= h_hi) & response[r0:r1, None]
        fai_sum[hs, :r1] += torch.where(band, probs, torch.zeros_like(probs)).sum(dim=-2)
    # |T(s)| = #response rows t in [s + h_lo, s + h_hi], from a prefix sum of the response mask.
    prefix = torch.cat([response.new_zeros(1, dtype=torch.long), response.long().cumsum(0)])
    s = torch.arange(n, device=q.device)
    first = (s + h_lo).clamp(max=n)
    last = (s + h_hi + 1).clamp(max=n)
    count = prefix[last] - prefix[first]
    fai_heads = torch.where(count > 0, fai_sum / count.clamp(min=1), torch.zeros_like(fai_sum))
    span = span_sum / response.sum().clamp(min=1)
    lead = q.shape[:-2]
    return span.reshape(lead), waad_rows.reshape(*lead, n), fai_heads.reshape(*lead, n)


def _triangular_block_solve(matrix: torch.Tensor, rhs: torch.Tensor, upper: bool) -> torch.Tensor:
    return torch.linalg.solve_triangular(matrix, rhs[:, None], upper=upper)[:, 0]


def streaming_flow_throughput(
    q: torch.Tensor,
    k: torch.Tensor,
    question_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    edge_threshold: float = 0.0,
    normalize: bool = True,
    scale: float | None = None,
    block_size: int = 256,
    heads_per_step: int = 1,
) -> torch.Tensor:
    """FlowTracer throughput from query/key states without any ``N x N`` matrix (arXiv 2606.10646).

    Equal (to float rounding) to :func:`credo.credit.flow.flow_throughput` on the mean of
    :func:`attention_from_qk` over all given heads (and layers); see :mod:`credo.credit.flow` for
    the equations. With ``C`` the thresholded mean map, ``s_i`` the outgoing sums and row blocks
    ``J``:

    - pass 1 (only if ``normalize``): ``s_i = sum_{k > i} C[k, i]``, accumulated over row blocks;
    - pass 2 (blocks last to first): ``h`` on ``J`` from the block's own triangle plus the
      accumulated ``r_i = sum_{k in later blocks} C[k, i] h(k)``;
    - pass 3 (first to last): ``f = h * g`` where ``g`` is the question mass pushed along ``W``,
      since ``f(k) = src(k) + h(k) sum_i C[k, i] f(i) / (s_i h(i))``.

    The sweeps run in float64. Memory: ``O(heads_per_step * block_size * N)``.

    Args:
        q: ``[H, N, d]`` or ``[L, H, N, d]`` query states of the layers to average.
        k: ``[H_kv, N, d]`` or ``[L, H_kv, N, d]`` key states.
        question_mask: ``[N]`` bool question tokens.
        answer_mask: ``[N]`` bool answer tokens.
        edge_threshold, normalize: as in :func:`credo.credit.flow.flow_capacity`.
        scale: logit scale (default ``1 / sqrt(d)``).
        block_size: query rows per block.
        heads_per_step: heads scored together.

    Returns:
        ``[N]`` float64 throughput.
    """
    q_flat, k_flat, kv_index = _flatten_heads(q, k)
    n, d = q.shape[-2:]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    question = _check_token_mask("question_mask", question_mask, n)
    answer = _check_token_mask("answer_mask", answer_mask, n)
    device = q.device
    heads = q_flat.shape[0]
    f64 = torch.float64

    def capacity_blocks(reverse: bool):
        """Yield ``(r0, r1, C[r0:r1, :r1])`` of the head-averaged, thresholded capacity."""
        total, current = None, None
        for r0, r1, hs, probs in _row_blocks(
            q_flat, k_flat, kv_index, scale, block_size, heads_per_step, reverse=reverse
        ):
            part = probs.sum(dim=0).to(f64)
            if current != r0:
                total, current = part, r0
            else:
                total += part
            if hs.stop == heads:
                mean = total / heads
                rows = torch.arange(r0, r1, device=device)
                past = torch.arange(r1, device=device)[None, :] < rows[:, None]
                keep = past & (mean >= edge_threshold)
                yield r0, r1, torch.where(keep, mean, torch.zeros_like(mean))

    out_sum = torch.ones(n, dtype=f64, device=device)
    if normalize:
        out_sum = torch.zeros(n, dtype=f64, device=device)
        for _, r1, cap in capacity_blocks(reverse=False):
            out_sum[:r1] += cap.sum(dim=0)
    has_out = out_sum > 0
    inv_out = torch.where(has_out, 1.0 / out_sum.clamp(min=1e-300), torch.zeros_like(out_sum))

    # Pass 2: h on block J solves (I - D C_JJ^T) h_J = 1[Ans]_J + D r_J, D = diag(not Ans / s).
    spread = torch.where(answer, torch.zeros_like(inv_out), inv_out)
    potential = torch.zeros(n, dtype=f64, device=device)
    reached = torch.zeros(n, dtype=f64, device=device)  # r_i
    for r0, r1, cap in capacity_blocks(reverse=True):
        inner = cap[:, r0:r1]  # [k, i], strictly lower
        eye = torch.eye(r1 - r0, dtype=f64, device=device)
        system = eye - spread[r0:r1, None] * inner.T
        rhs = answer[r0:r1].to(f64) + spread[r0:r1] * reached[r0:r1]
        h_block = _triangular_block_solve(system, rhs, upper=True)
        potential[r0:r1] = h_block
        reached[:r0] += h_block @ cap[:, :r0]

    # Pass 3: with e_i = 1[not Ans, h_i > 0] / (h_i s_i) and u = e * f,
    # f_J = src_J + h_J * (C_J,<J u_<J + C_JJ u_J)  ->  (I - diag(h_J) C_JJ diag(e_J)) f_J = ...
    live = (~answer) & (potential > 0)
    push = torch.where(live, inv_out / potential.clamp(min=1e-300), torch.zeros_like(potential))
    question = question & (potential > 0)
    source = question.to(f64) / question.sum().clamp(min=1)
    flow = torch.zeros(n, dtype=f64, device=device)
    pushed = torch.zeros(n, dtype=f64, device=device)  # u
    for r0, r1, cap in capacity_blocks(reverse=False):
        inner = cap[:, r0:r1]
        h_block = potential[r0:r1]
        eye = torch.eye(r1 - r0, dtype=f64, device=device)
        system = eye - h_block[:, None] * inner * push[None, r0:r1]
        rhs = source[r0:r1] + h_block * (cap[:, :r0] @ pushed[:r0])
        f_block = _triangular_block_solve(system, rhs, upper=False)
        flow[r0:r1] = f_block
        pushed[r0:r1] = push[r0:r1] * f_block
    return flow
