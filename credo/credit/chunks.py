"""Chunk-level credit for multi-turn agent trajectories (IPA, arXiv 2512.24873).

A *chunk* is a maximal run of 1s in a sample's response mask: one model-generated span between two
environment interactions. Observation/tool tokens carry mask 0 and separate the chunks. Everything
here is pure torch on ``[B, T]`` tensors. This module holds the chunk returns (the credit side);
the chunk primitives that the IPA policy loss also needs (:func:`chunk_ids`, :func:`num_chunks`,
:func:`chunk_mean`, :func:`chunk_ratio`, :func:`chunk_mismatch_mask`) live in
:mod:`credo.algos.chunks`, next to the loss (:mod:`credo.algos.ipa`), and are re-exported here.
"""

from __future__ import annotations

import torch

from credo.algos.chunks import (
    chunk_ids,
    chunk_mean,
    chunk_mismatch_mask,
    chunk_ratio,
    chunk_to_tokens,
    num_chunks,
)

__all__ = [
    "chunk_ids",
    "num_chunks",
    "chunk_mean",
    "chunk_returns",
    "chunk_returns_from_rewards",
    "chunk_ratio",
    "chunk_mismatch_mask",
]


def _check_2d(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {list(x.shape)}, expected [B, T]")


def chunk_returns(
    final_rewards: torch.Tensor, chunk_ids: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """Chunk-level discounted return of the final reward (IPA Eq. 7, arXiv 2512.24873).

        G_k = gamma^(K - 1 - k) * R        for every token of chunk k of a sample with K chunks

    The discount counts chunks, not tokens, so ``gamma^Delta`` does not vanish over thousands of
    tokens; the last chunk (the one that decides the outcome) gets the undiscounted reward.

    Args:
        final_rewards: ``[B]`` trajectory reward ``R``.
        chunk_ids: ``[B, T]`` from :func:`chunk_ids`.
        gamma: per-chunk discount. The paper's value is not given; ROLL's pipeline default is 1.0.

    Returns:
        ``[B, T]`` returns (dtype of ``final_rewards``), 0 outside the response.
    """
    _check_2d("chunk_ids", chunk_ids)
    if final_rewards.shape != (chunk_ids.shape[0],):
        raise ValueError(
            f"final_rewards has shape {list(final_rewards.shape)}, "
            f"expected [{chunk_ids.shape[0]}] (one reward per row of chunk_ids)"
        )
    rewards = final_rewards if final_rewards.is_floating_point() else final_rewards.float()
    chunks_after = (num_chunks(chunk_ids)[:, None] - 1 - chunk_ids).to(rewards.dtype)
    discount = torch.pow(torch.full_like(chunks_after, gamma), chunks_after)
    returns = discount * rewards[:, None]
    return torch.where(chunk_ids >= 0, returns, torch.zeros_like(returns))


def chunk_returns_from_rewards(
    chunk_rewards: torch.Tensor, chunk_ids: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """Chunk-level discounted return of per-chunk rewards (IPA Eq. 7 with intermediate rewards).

        G_k = r_k + gamma * G_{k+1},   G_K = 0

    This is ROLL's ``compute_agentic_reinforce_return`` with the reward of chunk ``k`` read at its
    last token. With a single reward on the last chunk it equals :func:`chunk_returns`.

    Args:
        chunk_rewards: ``[B, K_max]`` reward of each chunk; entries at ``k >= K_b`` (chunks that
            sample ``b`` does not have) are ignored.
        chunk_ids: ``[B, T]`` from :func:`chunk_ids`; every ``K_b`` must be ``<= K_max``.
        gamma: per-chunk discount.

    Returns:
        ``[B, T]`` returns, 0 outside the response.
    """
    _check_2d("chunk_rewards", chunk_rewards)
    _check_2d("chunk_ids", chunk_ids)
    if chunk_rewards.shape[0] != chunk_ids.shape[0]:
        raise ValueError(
            f"chunk_rewards has shape {list(chunk_rewards.shape)}, expected "
            f"[{chunk_ids.shape[0]}, K_max] (one row per row of chunk_ids)"
        )
    counts = num_chunks(chunk_ids)
    k_max = chunk_rewards.shape[1]
    if counts.numel() and int(counts.max()) > k_max:
        raise ValueError(
            f"chunk_rewards has {k_max} columns but a sample has {int(counts.max())} chunks"
        )
    rewards = chunk_rewards if chunk_rewards.is_floating_point() else chunk_rewards.float()
    exists = torch.arange(k_max, device=rewards.device)[None, :] < counts[:, None]
    rewards = torch.where(exists, rewards, torch.zeros_like(rewards))
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for k in range(k_max - 1, -1, -1):  # K_max is the number of turns: small
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return chunk_to_tokens(returns, chunk_ids, 0.0)
