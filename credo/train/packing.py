"""Padding-free packed forwards and token-budget micro-batches (`algo.packing`, `algo.micro_batch_tokens`).

A right-padded batch row holds one sample and then padding; on a long-tailed batch most of a padded forward is
padding. Packing puts several samples end to end in one row instead (first-fit decreasing, rows as wide as the
longest sample), with position ids that restart at 0 at each sample. With `attention_mask=None` and such position
ids, transformers (5.x, `masking_utils.find_packed_sequence_indices`) builds a block-diagonal causal mask for the
sdpa and eager attention of Llama/Qwen2-style models, so no token attends across samples: a packed forward gives
the padded forward's hidden states (tests/spine/test_packing.py checks it, and the losses and gradients of every
agg_mode). What is left of a row after its samples is one filler segment of its own (positions from 0 again),
which nothing reads.

The loss is untouched: the packed forward's log-probs land in the batch's usual [b, T] label-aligned layout, so
aggregation (normalised by the mini-batch's global token/sequence counts) cannot depend on the packing.

    row_lengths(attention_mask)                 -> real tokens per right-padded row
    first_fit_rows(lengths, width)              -> samples per packed row
    PackedRows.of(input_ids, attention_mask)    -> packed ids, position ids, where each sample starts
    token_micro_batches(lengths, budget, ...)   -> micro-batches of at most `budget` tokens
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row of a right-padded batch.

    Args:
        attention_mask: [B, L], 1 on real tokens, which must come first in each row (`credo.train.batch.pack`).
    Returns:
        [B] long.
    Raises:
        ValueError: a row has padding before a real token (left padding: its positions would differ packed).
    """
    lengths = attention_mask.sum(-1)
    prefix = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None, :] < lengths[:, None]
    if not torch.equal(prefix, attention_mask.bool()):
        bad = int((prefix != attention_mask.bool()).any(-1).nonzero()[0])
        raise ValueError(f"attention_mask row {bad} is not right-padded (real tokens first); packing needs the "
                         "layout of credo.train.batch.pack")
    return lengths


def first_fit_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per row, each row's lengths summing to at most `width`.

    Longest first (ties in index order); each sample goes to the first row with room. `width` must be at least
    the longest sample."""
    if lengths and max(lengths) > width:
        raise ValueError(f"a sample of {max(lengths)} tokens does not fit a packed row of {width}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(width - lengths[i])
    return rows


@dataclass
class PackedRows:
    """A batch's samples packed end to end in rows.

    input_ids: [R, W] long, the samples' real tokens (0 in the filler).
    position_ids: [R, W] long, 0..n-1 within each sample and within the filler that ends a row.
    starts: [B] long, where sample b's first token sits in the flattened [R * W] rows.
    real_tokens: the samples' tokens; R * W of them are computed.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    starts: torch.Tensor
    real_tokens: int

    @staticmethod
    def of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> "PackedRows":
        """Pack the rows of a right-padded batch (input_ids, attention_mask: [B, L]) into rows as wide as the
        longest sample."""
        lengths = row_lengths(attention_mask).tolist()
        width = max(lengths)
        rows = first_fit_rows(lengths, width)
        ids = input_ids.new_zeros(len(rows), width)
        pos = torch.zeros(len(rows), width, dtype=torch.long, device=input_ids.device)
        starts = [0] * len(lengths)
        ramp = torch.arange(width, device=input_ids.device)
        for r, members in enumerate(rows):
            offset = 0
            for i in members:
                n = lengths[i]
                ids[r, offset:offset + n] = input_ids[i, :n]
                pos[r, offset:offset + n] = ramp[:n]
                starts[i] = r * width + offset
                offset += n
            pos[r, offset:] = ramp[:width - offset]  # the filler: a segment of its own
        return PackedRows(ids, pos, torch.tensor(starts, dtype=torch.long, device=input_ids.device), sum(lengths))

    def flat_index(self, token_mask: torch.Tensor) -> torch.Tensor:
        """Where, in the flattened [R * W] packed positions, the hidden state that scores each selected label sits.

        Args:
            token_mask: [B, T] bool, label-aligned (column j scores token j+1 of its sample).
        Returns:
            [N] long, in the order of `hidden[:, :-1][token_mask]` on the padded batch.
        """
        rows, cols = token_mask.nonzero(as_tuple=True)
        return self.starts[rows] + cols

    @property
    def fill(self) -> float:
        """The share of computed positions that hold a sample's token."""
        return self.real_tokens / self.input_ids.numel()


def token_micro_batches(lengths: list[int], budget: int, *, packed: bool) -> list[list[int]]:
    """Split samples (positions 0..n-1 of `lengths`) into micro-batches of at most `budget` tokens.

    Samples are taken longest first and added to the current micro-batch while it stays within the budget:
    packed, its tokens are the sum of its lengths; padded, its row count times its longest length (so similar
    lengths share a micro-batch and little is padding). A sample longer than `budget` makes a micro-batch alone.
    """
    order = sorted(range(len(lengths)), key=lambda k: -lengths[k])
    groups: list[list[int]] = []
    used = 0
    for i in order:
        n = lengths[i]
        if groups:
            cost = used + n if packed else (len(groups[-1]) + 1) * lengths[groups[-1][0]]
            if cost <= budget:
                groups[-1].append(i)
                used = cost
                continue
        groups.append([i])
        used = n
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split until there are `count` of them (the largest group in two, halves by position), so every
    data-parallel rank runs the same number of micro-batches (ZeRO-3 gathers weights in each forward)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        k = max(range(len(groups)), key=lambda j: len(groups[j]))
        if len(groups[k]) < 2:
            raise ValueError(f"cannot split {sum(map(len, groups))} samples into {count} micro-batches")
        g = groups.pop(k)
        groups[k:k] = [g[:len(g) // 2], g[len(g) // 2:]]
    return groups
