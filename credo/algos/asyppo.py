"""AsyPPO mini-critic helpers (Asymmetric Proximal Policy Optimization, arXiv 2510.01656).

AsyPPO trains ``M`` small critics next to a large actor. Each critic trains on a disjoint share of
every prompt's group of responses (:func:`critic_shards`, Sec. "group-level non-overlapping data
division"); their mean is the value for GAE (:func:`asyppo_value_mean`, mean beats min in the
paper's Fig. 9d); and the per-token standard deviation across critics ``sigma_t`` becomes two
masks (:func:`asyppo_masks`): the policy-gradient term is dropped where the critics agree most
(the lowest ``sigma``) and the entropy bonus where they disagree most (the highest ``sigma``).
The paper's defaults are ``M = 2`` and 20% for both shares.

How to apply the masks: the paper's objective (Eq. 6) multiplies each token's clipped term by
``I^A`` and its entropy term by ``I^H`` *inside* the ``1/|o|`` mean, so masked tokens stay in the
denominator. Pass ``adv_keep`` to a policy loss as ``weights=adv_keep.to(log_probs.dtype)`` (not
as ``mask``, which would drop them from the count) and aggregate the bonus as
``aggregate(entropy * entropy_keep, mask, agg_mode)``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from credo.algos._validate import as_bool_mask, check_finite, check_tensor, shape_str

__all__ = ["asyppo_masks", "asyppo_value_mean", "critic_shards"]


def critic_shards(group_ids: torch.Tensor, num_critics: int) -> torch.Tensor:
    """The critic that trains on each sample: its rank inside its group, modulo ``M``.

    AsyPPO (arXiv 2510.01656, Sec. 3.2) splits the responses of every prompt uniformly and
    disjointly among the ``M`` critics, so every critic sees every prompt but different responses.
    Critic ``m`` trains only on the samples with ``critic_shards(...) == m``. The rank of a sample
    inside its group follows batch order (the first sample of a group has rank 0), whatever the
    order of the groups: groups may be interleaved and of unequal sizes. A group of ``G`` samples
    gives ``ceil(G / M)`` samples to critics ``0 .. (G mod M) - 1`` and ``floor(G / M)`` to the
    others, so with ``G >= M`` every critic sees every prompt. ``rank mod M`` is the spec's
    ``shard_id`` (inferred from the paper's "uniformly and disjointly"; any such split fits it).

    Args:
        group_ids: ``[B]`` integer group (prompt) id of each sample.
        num_critics: ``M >= 1``.

    Returns:
        ``[B]`` int64 critic index in ``0 .. M-1``, on the device of ``group_ids``.

    Raises:
        ValueError: ``group_ids`` not a 1-d integer tensor, or ``num_critics`` not an int >= 1.
    """
    check_tensor("group_ids", group_ids, ndim=1)
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids has dtype {group_ids.dtype}, expected an integer dtype")
    if isinstance(num_critics, bool) or not isinstance(num_critics, int) or num_critics < 1:
        raise ValueError(f"num_critics is {num_critics!r}, expected an int >= 1")
    B = group_ids.shape[0]
    # A stable sort keeps batch order inside each group; a sample's rank is its distance to the
    # start of its run of equal ids in the sorted order.
    order = torch.sort(group_ids, stable=True).indices
    ids = group_ids[order]
    position = torch.arange(B, device=group_ids.device)
    starts = torch.ones(B, dtype=torch.bool, device=group_ids.device)
    starts[1:] = ids[1:] != ids[:-1]
    run_start = torch.cummax(torch.where(starts, position, torch.zeros_like(position)), dim=0).values
    rank = torch.empty_like(position)
    rank[order] = position - run_start
    return rank % num_critics


def asyppo_value_mean(values: torch.Tensor) -> torch.Tensor:
    """Ensemble value ``Vbar = (1/M) sum_m V_m`` (arXiv 2510.01656, Eq. 2; the mean aggregation).

    Feed it to :func:`credo.algos.advantages.gae` as ``values`` for the corrected advantage.

    Args:
        values: ``[M, B, T]`` floating values of the ``M`` critics.

    Returns:
        ``[B, T]`` mean over critics (dtype of ``values``; gradients flow to every critic).
    """
    check_tensor("values", values, ndim=3, floating=True)
    if values.shape[0] < 1:
        raise ValueError(f"values has shape {shape_str(values)}, expected [M, B, T] with M >= 1 critics")
    return values.mean(dim=0)


def _share(name: str, frac) -> Fraction:
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        raise ValueError(f"{name} is {frac!r}, expected a number in [0, 1]")
    return Fraction(repr(float(frac)))  # the decimal it prints as: 0.29 is 29/100, not 0.28999...


def asyppo_masks(
    values: torch.Tensor,
    mask: torch.Tensor,
    low_frac: float,
    high_frac: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AsyPPO's advantage mask and entropy mask from the critics' disagreement (arXiv 2510.01656).

    ``sigma_t = std_m V_m(s_t)`` per token, the **population** std over the ``M`` critics
    (divide by ``M``, the normaliser of the ensemble mean; ``|V_1 - V_2| / 2`` for ``M = 2``). The
    paper writes "std" without saying which (inferred); the masks do not depend on the choice,
    because for a fixed ``M`` both are the same increasing function of the sum of squared
    deviations. Computed from detached values, in float32 for half-precision inputs, after sorting
    each token's ``M`` values: ``sigma`` then depends on the set of critic values only, bit for
    bit, so the masks do not change when the critics are reordered and tokens whose critics hold
    the same values (in any order) tie exactly. Ties below are ties of this computed value.

    Let ``n`` be the number of valid tokens (``mask`` True) over the whole batch (batch-level
    quantiles, as the paper's Algorithm 1: ``Low_k(sigma(O))`` over all generated tokens), and rank
    them by ``(sigma_t, flat index b * T + t)`` ascending: one total order, ties broken by position.

    - ``adv_keep`` (Eq. 4, ``I^A``) is False on the first ``k_low = floor(low_frac * n)`` ranks:
      the tokens where the critics agree most lose the policy-gradient term. Among equal sigmas
      at the threshold, the earliest in flat order are dropped first.
    - ``entropy_keep`` (Eq. 5, ``I^H``) is False on the last ``k_high = floor(high_frac * n)``
      ranks: the tokens where they disagree most lose the entropy bonus. Among equal sigmas at
      the threshold, the *latest* in flat order are dropped first.

    So exactly ``k_low`` and ``k_high`` valid tokens are dropped, and since ``low_frac + high_frac
    <= 1`` the two dropped sets never overlap. ``low_frac`` and ``high_frac`` are read as the
    decimals they print as (``floor(0.29 * 100) = 29`` although ``0.29 * 100`` is 28.999... in
    binary). Invalid tokens are False in both masks. The paper's defaults are 0.2 and 0.2.

    Args:
        values: ``[M, B, T]`` floating critic values, ``M >= 2``; must be finite on valid tokens.
        mask: ``[B, T]`` bool or 0/1 floating, True on the tokens that count (response tokens).
        low_frac: share of valid tokens, lowest sigma first, whose advantage is masked (``k``).
        high_frac: share of valid tokens, highest sigma first, whose entropy bonus is masked (``h``).

    Returns:
        ``(adv_keep, entropy_keep)``: two ``[B, T]`` bool tensors on the device of ``values``.

    Raises:
        ValueError: ``values`` not ``[M, B, T]`` matching ``mask``, ``M < 2``, non-finite values on
            valid tokens, ``low_frac``/``high_frac`` outside ``[0, 1]``, or their sum above 1,
            each naming the argument.
    """
    check_tensor("mask", mask, ndim=2)
    check_tensor("values", values, floating=True)
    B, T = mask.shape
    if values.dim() != 3 or tuple(values.shape[1:]) != (B, T):
        raise ValueError(
            f"values has shape {shape_str(values)}, expected [M, {B}, {T}] (M critics) matching mask {shape_str(mask)}"
        )
    if values.shape[0] < 2:
        raise ValueError(
            f"values has shape {shape_str(values)}: {values.shape[0]} critic(s), "
            "expected M >= 2 (sigma is a std over critics)"
        )
    low, high = _share("low_frac", low_frac), _share("high_frac", high_frac)
    if low + high > 1:
        raise ValueError(f"low_frac + high_frac is {low_frac} + {high_frac} = {float(low + high)}, expected at most 1")
    m = as_bool_mask(mask, "values[0]", values[0])
    check_finite("values", values, m.expand_as(values))

    v = values.detach()
    if v.dtype in (torch.float16, torch.bfloat16):
        v = v.float()
    # sorted per token: floating-point sums depend on order, and equal critic values in another
    # order must give the same sigma bit for bit (exact ties, critic-order invariance)
    sigma = torch.sort(v, dim=0).values.std(dim=0, correction=0)

    valid = m.reshape(-1)
    n = int(valid.sum())
    k_low, k_high = math.floor(low * n), math.floor(high * n)
    candidates = valid.nonzero().squeeze(1)  # flat indices of the valid tokens, ascending
    # stable: equal sigmas keep ascending flat order, giving the (sigma, flat index) order
    ranked = candidates[torch.sort(sigma.reshape(-1)[candidates], stable=True).indices]
    adv_keep, entropy_keep = valid.clone(), valid.clone()
    adv_keep[ranked[:k_low]] = False
    entropy_keep[ranked[n - k_high:]] = False
    return adv_keep.reshape(B, T), entropy_keep.reshape(B, T)
