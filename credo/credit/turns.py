"""Turn-level Monte-Carlo returns and Return Batch Normalisation (ReBN) of GEM (arXiv 2510.01051).

An action is one model turn; each turn k of an episode has a reward r_k. GEM's REINFORCE + ReBN:

    G_k = r_k + gamma * G_{k+1}    (G_K = 0)
    A_k = (G_k - mean(G)) / (std(G) + eps)      mean and std over every turn of every episode in the batch

The statistics are per transition (each turn counts once, whatever its token count), with the population
std sqrt(E[G^2] - E[G]^2) and eps = 1e-9, as GEM's Oat learner (its Tinker script uses torch's unbiased
std). Every token of turn k then gets A_k (:func:`credo.credit.chunks.chunk_to_tokens` with the turns as
chunks). Pure torch on [B, K] tensors.
"""

from __future__ import annotations

import torch

__all__ = ["turn_returns", "return_batch_norm"]


def _turn_mask(turn_rewards: torch.Tensor, num_turns: torch.Tensor) -> torch.Tensor:
    if turn_rewards.dim() != 2:
        raise ValueError(f"turn_rewards has shape {list(turn_rewards.shape)}, expected [B, K]")
    if num_turns.shape != (turn_rewards.shape[0],):
        raise ValueError(f"num_turns has shape {list(num_turns.shape)}, expected [{turn_rewards.shape[0]}] "
                         "(one count per row of turn_rewards)")
    if num_turns.numel() and (int(num_turns.max()) > turn_rewards.shape[1] or int(num_turns.min()) < 0):
        raise ValueError(f"num_turns must be in [0, {turn_rewards.shape[1]}] (the columns of turn_rewards)")
    return torch.arange(turn_rewards.shape[1], device=turn_rewards.device)[None, :] < num_turns[:, None]


def turn_returns(turn_rewards: torch.Tensor, num_turns: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted Monte-Carlo return of every turn (GEM, arXiv 2510.01051, Sec. 3).

    Args:
        turn_rewards: ``[B, K]`` reward of turn k of episode b; columns ``k >= num_turns[b]`` are ignored.
        num_turns: ``[B]`` int, the turns episode b took.
        gamma: per-turn discount.

    Returns:
        ``[B, K]`` float returns ``G_k``, 0 at ``k >= num_turns[b]``.
    """
    exists = _turn_mask(turn_rewards, num_turns)
    r = torch.where(exists, turn_rewards.float() if not turn_rewards.is_floating_point() else turn_rewards,
                    torch.zeros((), dtype=torch.float32 if not turn_rewards.is_floating_point() else turn_rewards.dtype))
    # reversed discounted cumulative sum as one matrix product: G = r @ D, D[j, k] = gamma^(j-k) for j >= k
    K = r.shape[1]
    j = torch.arange(K, device=r.device)
    power = (j[:, None] - j[None, :]).to(r.dtype)
    D = torch.where(power >= 0, torch.full_like(power, gamma) ** power.clamp(min=0), torch.zeros_like(power))
    return torch.where(exists, r @ D, torch.zeros_like(r))


def return_batch_norm(returns: torch.Tensor, valid: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """ReBN: standardise returns over the valid transitions of the batch (population std).

    Args:
        returns: ``[B, K]`` turn returns.
        valid: ``[B, K]`` bool, the transitions that count (existing turns of kept episodes).
        eps: added to the std.

    Returns:
        ``[B, K]`` normalised returns, 0 where not valid (all 0 when no transition is valid).
    """
    if valid.shape != returns.shape:
        raise ValueError(f"valid has shape {list(valid.shape)}, expected {list(returns.shape)} like returns")
    v = valid.bool()
    n = v.sum()
    if int(n) == 0:
        return torch.zeros_like(returns)
    x = torch.where(v, returns, torch.zeros_like(returns))
    mean = x.sum() / n
    var = (torch.where(v, (returns - mean) ** 2, torch.zeros_like(returns))).sum() / n
    return torch.where(v, (returns - mean) / (var.sqrt() + eps), torch.zeros_like(returns))
