"""AsyPPO's mini-critic helpers (arXiv 2510.01656): group-level data shards and inter-critic uncertainty masks.

Minimal version written beside the critic stage; another branch carries the reference implementation of
the same two functions with the same names, signatures and semantics.
"""

from __future__ import annotations

import torch

from credo.algos._validate import as_bool_mask, check_tensor


def critic_shards(group_ids: torch.Tensor, num_critics: int) -> torch.Tensor:
    """Which mini-critic trains on each sample (AsyPPO Sec. 2.1, arXiv 2510.01656).

    Each prompt's responses are split disjointly over the critics: a sample's rank inside its group
    (ranks follow batch order), mod ``num_critics``. So every critic sees every prompt, but different
    responses of it. The paper states "split uniformly and disjointly"; rank mod M is inferred.

    Args:
        group_ids: ``[B]`` integer, the prompt each sample answers (groups need not be contiguous).
        num_critics: M >= 1.

    Returns:
        ``[B]`` long, the critic index in ``[0, M)`` of each sample.
    """
    check_tensor("group_ids", group_ids, ndim=1)
    if num_critics < 1:
        raise ValueError(f"num_critics = {num_critics}, expected >= 1")
    same = group_ids[:, None] == group_ids[None, :]  # [B, B]
    earlier = torch.ones_like(same).tril(-1)  # j < i
    rank_in_group = (same & earlier).sum(-1)
    return (rank_in_group % num_critics).long()


def asyppo_masks(values: torch.Tensor, mask: torch.Tensor, low_frac: float, high_frac: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage mask and entropy filter from the critics' disagreement (AsyPPO Eqs. 3-4, arXiv 2510.01656)::

        sigma_t      = std over the M critics of V_m(s_t)
        adv_keep     = False on the floor(low_frac * N) valid tokens with the smallest sigma
        entropy_keep = False on the floor(high_frac * N) valid tokens with the largest sigma

    N is the number of valid tokens in the whole batch (the paper's Algorithm 1 takes Low_k / Top_h over
    the generated batch; the quantile scope is inferred). Ties are broken by batch order. Invalid tokens
    are False in both masks.

    Args:
        values: ``[M, B, T]`` the critics' values.
        mask: ``[B, T]`` bool or 0/1, the valid tokens.
        low_frac: k in [0, 1]. high_frac: h in [0, 1], with k + h <= 1.

    Returns:
        ``(adv_keep, entropy_keep)``, both ``[B, T]`` bool.
    """
    check_tensor("values", values, ndim=3, floating=True)
    m = as_bool_mask(mask, "values[0]", values[0])
    if not (0 <= low_frac <= 1 and 0 <= high_frac <= 1 and low_frac + high_frac <= 1):
        raise ValueError(f"low_frac = {low_frac}, high_frac = {high_frac}: expected each in [0, 1] and a sum <= 1")
    sigma = values.detach().float().std(0, unbiased=False)[m]  # [N]
    n = sigma.numel()
    order = torch.argsort(sigma, stable=True)
    k, h = int(low_frac * n), int(high_frac * n)
    adv_rows = torch.ones(n, dtype=torch.bool, device=values.device)
    ent_rows = torch.ones(n, dtype=torch.bool, device=values.device)
    adv_rows[order[:k]] = False
    ent_rows[order[n - h:]] = False
    adv_keep = torch.zeros_like(m).masked_scatter(m, adv_rows)
    entropy_keep = torch.zeros_like(m).masked_scatter(m, ent_rows)
    return adv_keep, entropy_keep
