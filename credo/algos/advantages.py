"""Advantage estimators, registered by name for recipes (``algo.advantage: <name>``).

Outcome-reward estimators (``OUTCOME_ESTIMATORS``) share one signature::

    fn(rewards [B], group_ids [B], mask [B, T], **kwargs) -> advantages [B, T]

``group_ids`` is an integer tensor; groups need not be contiguous nor of equal size. The
sequence-level advantage is broadcast to the masked tokens (0 elsewhere). They are presets of
:func:`normalize_rewards`. Conventions for degenerate groups:

- all rewards equal in a mean scope -> exactly 0 advantage (no NaN, no eps-amplified noise);
- singleton group (group mean) -> 0 advantage: there is no baseline to compare with (verl's
  GRPO instead gives a singleton its raw reward);
- a std scope whose values are all equal (std 0, or fewer than 2 members with ``unbiased``)
  does not rescale (divides by 1 instead of eps).

``gae`` and ``rebn`` have their own signatures (token rewards and values; turn rewards); the
registry maps each name to its kind in :data:`ADVANTAGE_INPUTS`.
"""

from __future__ import annotations

from typing import Callable

import torch

from credo.algos._validate import (
    as_bool_mask, check_choice, check_finite, check_like, check_tensor, masked_fill_zero, register,
)

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}
ADVANTAGE_INPUTS: dict[str, str] = {}
"""Name -> input kind: ``"outcome"`` (shared signature above), ``"token_rewards_values"`` (gae),
``"turn_rewards"`` (rebn)."""
GROUP_ESTIMATORS = frozenset({
    "grpo",  # group mean and std
    "dr_grpo",  # group mean
    "rloo",  # leave-one-out group mean
    "reinforce_pp_baseline",  # group mean, then batch whitening
    "lite_ppo",  # group mean, batch std
})
"""Estimators whose baseline is the group (prompt) mean: with one sample per prompt every advantage is 0."""

SCOPES = ("group", "batch", "none")


def register_advantage_estimator(name: str, *, inputs: str = "outcome") -> Callable[[Callable], Callable]:
    """Decorator recording an estimator in :data:`ADVANTAGE_ESTIMATORS` (and its input kind in
    :data:`ADVANTAGE_INPUTS`). ``inputs="outcome"`` promises the shared outcome signature."""

    def decorator(fn: Callable) -> Callable:
        register(ADVANTAGE_ESTIMATORS, "advantage estimator", name, fn)
        ADVANTAGE_INPUTS[name] = inputs
        return fn

    return decorator


def _segment_stats(x, seg, n_seg, w, unbiased):
    """Weighted mean, std and a degenerate flag per segment (frequency weights ``w``)."""
    wsum = torch.zeros(n_seg, dtype=x.dtype, device=x.device).index_add_(0, seg, w)
    total = torch.zeros_like(wsum).index_add_(0, seg, w * x)
    mean = torch.where(wsum > 0, total / wsum.clamp_min(1e-30), 0.0)
    dev = x - mean[seg]
    ss = torch.zeros_like(wsum).index_add_(0, seg, w * dev * dev)
    dof = wsum - 1 if unbiased else wsum
    std = torch.where(dof > 0, ss / dof.clamp_min(1e-30), 0.0).sqrt()
    live = w > 0
    hi = torch.full_like(wsum, -torch.inf).scatter_reduce(0, seg, torch.where(live, x, -torch.inf), "amax")
    lo = torch.full_like(wsum, torch.inf).scatter_reduce(0, seg, torch.where(live, x, torch.inf), "amin")
    degenerate = (hi <= lo) | (dof <= 0)
    return mean, std, degenerate


def normalize_rewards(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    mean_scope: str = "group",
    std_scope: str = "group",
    eps: float = 1e-6,
    unbiased: bool = True,
    sample_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Shifts and scales rewards by group- or batch-level statistics (arXiv 2508.08221 Sec. 4.1)::

        A_i = (R_i - mean_{mean_scope}(R)) / (std_{std_scope}(R) + eps)

    The std is of the raw rewards over its scope (as ROLL's ``reward_norm``), not of the
    shifted ones. ``"none"`` skips the shift / the scaling. Degenerate scopes follow the module
    conventions (all-equal mean scope -> 0; std 0 -> no scaling).

    Args:
        rewards: ``[B]`` floating sequence rewards.
        group_ids: ``[B]`` integer group (prompt) ids.
        mean_scope, std_scope: ``"group"``, ``"batch"`` or ``"none"``.
        eps: added to the std.
        unbiased: Bessel-corrected std (``torch.std`` default) if True, population std otherwise.
        sample_weights: ``[B]`` non-negative frequency weights for the statistics (e.g. token
            counts, making the statistics token-weighted as OpenRLHF/verl whitening is); None
            means 1 per sequence.

    Returns:
        ``[B]`` normalised rewards.
    """
    check_tensor("rewards", rewards, ndim=1, floating=True)
    check_tensor("group_ids", group_ids, ndim=1)
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise ValueError(f"group_ids has dtype {group_ids.dtype}, expected an integer dtype")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids has shape [{group_ids.shape[0]}], expected [{rewards.shape[0]}] like rewards")
    check_choice("mean_scope", mean_scope, SCOPES)
    check_choice("std_scope", std_scope, SCOPES)
    check_finite("rewards", rewards)
    if sample_weights is None:
        w = torch.ones_like(rewards)
    else:
        check_like("sample_weights", sample_weights, "rewards", rewards, floating=False)
        w = sample_weights.to(rewards.dtype)
        check_finite("sample_weights", w)
        if bool((w < 0).any()):
            raise ValueError("sample_weights has negative values, expected weights >= 0")
    r = rewards.detach()

    computed: dict[str, tuple] = {}

    def stats(scope):  # once per scope: GRPO-style presets use the same scope for mean and std
        if scope in computed:
            return computed[scope]
        if scope == "group":
            _, seg = torch.unique(group_ids, return_inverse=True)
            n_seg = int(seg.max()) + 1 if seg.numel() else 0
        else:
            seg = torch.zeros_like(group_ids, dtype=torch.long)
            n_seg = 1
        mean, std, degenerate = _segment_stats(r, seg, n_seg, w, unbiased)
        computed[scope] = mean[seg], std[seg], degenerate[seg]
        return computed[scope]

    out = r
    if mean_scope != "none":
        mean, _, degenerate = stats(mean_scope)
        out = torch.where(degenerate, 0.0, r - mean)
    if std_scope != "none":
        _, std, degenerate = stats(std_scope)
        out = out / torch.where(degenerate, 1.0, std + eps)
    return out


def _mask_like(mask, rewards) -> torch.Tensor:
    # the [B, T] mask as bool, one row per reward: checked before its row lengths become sample weights too
    check_tensor("mask", mask, ndim=2)
    if mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask has shape [{mask.shape[0]}, {mask.shape[1]}], expected [{rewards.shape[0]}, T] like rewards")
    return as_bool_mask(mask, "mask", mask)


def _broadcast(seq_adv: torch.Tensor, mask, rewards) -> torch.Tensor:
    m = _mask_like(mask, rewards)
    return masked_fill_zero(seq_adv.unsqueeze(-1).expand(m.shape), m)


def reinforce(rewards, group_ids, mask) -> torch.Tensor:
    """REINFORCE without a baseline (Williams 1992): ``A_i = R_i``, the raw reward on every token.

    The high-variance reference that every baseline improves on; the testbed's deliberately weak
    variant (issue #12). ``group_ids`` is unused (kept for the shared signature).
    """
    return _broadcast(normalize_rewards(rewards, group_ids, mean_scope="none", std_scope="none"), mask, rewards)


reinforce = register_advantage_estimator("reinforce")(reinforce)


def grpo(rewards, group_ids, mask, *, norm_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-relative advantage (DeepSeekMath, arXiv 2402.03300)::

        A_i = (R_i - mean_group(R)) / (std_group(R) + eps)     (unbiased std; no std if not norm_std)
    """
    adv = normalize_rewards(rewards, group_ids, mean_scope="group", std_scope="group" if norm_std else "none", eps=eps)
    return _broadcast(adv, mask, rewards)


grpo = register_advantage_estimator("grpo")(grpo)


def dr_grpo(rewards, group_ids, mask) -> torch.Tensor:
    """Dr. GRPO (arXiv 2503.20783): group mean only, ``A_i = R_i - mean_group(R)``."""
    return _broadcast(normalize_rewards(rewards, group_ids, mean_scope="group", std_scope="none"), mask, rewards)


dr_grpo = register_advantage_estimator("dr_grpo")(dr_grpo)


def rloo(rewards, group_ids, mask) -> torch.Tensor:
    """RLOO leave-one-out baseline (Kool et al. 2019; Ahmadian et al. arXiv 2402.14740)::

        A_i = R_i - (1 / (n - 1)) sum_{j != i, j in group(i)} R_j = n / (n - 1) (R_i - mean_group(R))

    Singleton groups get 0 (no other sample to compare with).
    """
    check_tensor("rewards", rewards, ndim=1, floating=True)
    centered = normalize_rewards(rewards, group_ids, mean_scope="group", std_scope="none")
    _, seg = torch.unique(group_ids, return_inverse=True)
    n = torch.zeros(int(seg.max()) + 1 if seg.numel() else 0, dtype=rewards.dtype, device=rewards.device)
    n = n.index_add_(0, seg, torch.ones_like(rewards))[seg]
    adv = torch.where(n > 1, centered * n / (n - 1).clamp_min(1), 0.0)
    return _broadcast(adv, mask, rewards)


rloo = register_advantage_estimator("rloo")(rloo)


def reinforce_pp(rewards, group_ids, mask, *, eps: float = 1e-8, token_weighted: bool = True) -> torch.Tensor:
    """REINFORCE++ (arXiv 2501.03262): batch whitening of the rewards::

        A_i = (R_i - mean_batch(R)) / (std_batch(R) + eps)

    ``group_ids`` is unused (kept for the shared signature). ``token_weighted=True`` computes the
    batch statistics over tokens (each sequence weighted by its masked length, unbiased), as
    OpenRLHF/verl whiten the broadcast token advantages; they use ``rsqrt(var + 1e-8)`` where we
    use ``1 / (std + eps)`` (equal unless the variance is ~1e-8).
    """
    sw = _mask_like(mask, rewards).sum(-1).to(rewards.dtype) if token_weighted else None
    adv = normalize_rewards(rewards, group_ids, mean_scope="batch", std_scope="batch", eps=eps, sample_weights=sw)
    return _broadcast(adv, mask, rewards)


reinforce_pp = register_advantage_estimator("reinforce_pp")(reinforce_pp)


def reinforce_pp_baseline(rewards, group_ids, mask, *, eps: float = 1e-8, token_weighted: bool = True) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262): subtract the group mean, then whiten over the batch::

        x_i = R_i - mean_group(R);    A_i = (x_i - mean_batch(x)) / (std_batch(x) + eps)

    ``token_weighted`` as in :func:`reinforce_pp` (applies to the batch whitening).
    """
    centered = normalize_rewards(rewards, group_ids, mean_scope="group", std_scope="none")
    sw = _mask_like(mask, rewards).sum(-1).to(rewards.dtype) if token_weighted else None
    adv = normalize_rewards(centered, group_ids, mean_scope="batch", std_scope="batch", eps=eps, sample_weights=sw)
    return _broadcast(adv, mask, rewards)


reinforce_pp_baseline = register_advantage_estimator("reinforce_pp_baseline")(reinforce_pp_baseline)


def lite_ppo(rewards, group_ids, mask, *, eps: float = 1e-6) -> torch.Tensor:
    """Lite PPO advantage (arXiv 2508.08221): group mean, batch std (ROLL ``norm_mean_type: group``,
    ``norm_std_type: batch``)::

        A_i = (R_i - mean_group(R)) / (std_batch(R) + 1e-6)     (unbiased std, per sequence)
    """
    adv = normalize_rewards(rewards, group_ids, mean_scope="group", std_scope="batch", eps=eps)
    return _broadcast(adv, mask, rewards)


lite_ppo = register_advantage_estimator("lite_ppo")(lite_ppo)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (arXiv 1506.02438) over the masked tokens::

        delta_t = r_t + gamma V(next) - V_t;      A_t = delta_t + gamma lam A(next)

    where "next" is the next token *with mask 1* (0 after the last one). Tokens with mask 0
    (prompt, padding, and in multi-turn rollouts the environment's observation tokens) are
    skipped by the recursion, as verl does: the value and advantage carry across them, and their
    rewards and values are ignored (put turn rewards on a response token). ROLL does *not* skip
    them: its ``compute_gae_advantage_return`` zeroes rewards and values outside the mask and runs
    the recursion over every position, so an observation token inside a response is a step with
    ``V = 0`` and one more ``gamma * lam`` of discount (trailing padding gives the same result
    either way). The advantages are **not whitened**; verl whitens them over the mask
    (``masked_whiten``) and ROLL does with ``whiten_advantages``; whiten afterwards if wanted.
    Defaults ``gamma = lam = 1`` (verl's defaults). Inputs are detached.

    Args:
        token_rewards: ``[B, T]`` per-token rewards.
        values: ``[B, T]`` critic values V(s_t).
        mask: ``[B, T]`` bool or 0/1 floating.

    Returns:
        ``(advantages, returns)``, both ``[B, T]`` and 0 outside the mask; ``returns = A + V``
        (the value-function target).
    """
    check_tensor("token_rewards", token_rewards, ndim=2, floating=True)
    check_like("values", values, "token_rewards", token_rewards)
    m = as_bool_mask(mask, "token_rewards", token_rewards)
    check_finite("token_rewards", token_rewards, m)
    check_finite("values", values, m)
    r = masked_fill_zero(token_rewards.detach(), m)
    v = masked_fill_zero(values.detach().to(r.dtype), m)
    B, T = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(B, dtype=r.dtype, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(mt, a, 0.0)
        next_value = torch.where(mt, v[:, t], next_value)
        next_adv = torch.where(mt, a, next_adv)
    return adv, masked_fill_zero(adv + v, m)


gae = register_advantage_estimator("gae", inputs="token_rewards_values")(gae)


def turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """Per-turn discounted returns ``G_k = r_k + gamma G_{k+1}`` within each episode (row).

    Turns with ``turn_mask`` 0 are skipped (their reward ignored, the return carried across).

    Args:
        turn_rewards: ``[B, K]`` reward of each turn (action = one whole LLM response).
        turn_mask: ``[B, K]`` bool or 0/1 floating, True on the turns that exist.

    Returns:
        ``[B, K]`` returns, 0 on missing turns.
    """
    check_tensor("turn_rewards", turn_rewards, ndim=2, floating=True)
    m = as_bool_mask(turn_mask, "turn_rewards", turn_rewards, name="turn_mask")
    check_finite("turn_rewards", turn_rewards, m)
    r = masked_fill_zero(turn_rewards.detach(), m)
    out = torch.zeros_like(r)
    g = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for k in range(r.shape[1] - 1, -1, -1):
        g = torch.where(m[:, k], r[:, k] + gamma * g, g)
        out[:, k] = torch.where(m[:, k], g, 0.0)
    return out


def rebn(
    turn_rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    token_turn_ids: torch.Tensor,
    *,
    gamma: float = 1.0,
    normalize: bool = True,
    eps: float = 1e-9,
    unbiased: bool = False,
) -> torch.Tensor:
    """REINFORCE with Return Batch Normalisation (GEM, arXiv 2510.01051)::

        G_k = r_k + gamma G_{k+1}                          (per turn, within an episode)
        A_k = (G_k - mean_batch(G)) / (std_batch(G) + eps)  (over all existing turns of the batch)

    The statistics are per transition (each turn counts once, however many tokens it has) — not
    token-weighted like ROLL's ``masked_whiten``. Population std and eps 1e-9 as GEM's Oat learner
    (``unbiased=True`` gives its Tinker script's ``torch.std``). With ``normalize=False`` it is
    plain REINFORCE on raw returns. Every token of turn ``k`` gets ``A_k``. For data-parallel
    training compute it on the whole batch (GEM all-reduces the statistics). All turns equal
    gives 0 (see the module conventions).

    Args:
        turn_rewards: ``[B, K]`` per-turn rewards.
        turn_mask: ``[B, K]`` bool or 0/1 floating, True on existing turns.
        token_turn_ids: ``[B, T]`` integer turn index of each token, -1 for tokens outside any
            action (prompt, observations, padding).
        gamma: discount.

    Returns:
        ``[B, T]`` token advantages, 0 where ``token_turn_ids == -1``.
    """
    G = turn_returns(turn_rewards, turn_mask, gamma=gamma)
    tm = as_bool_mask(turn_mask, "turn_rewards", turn_rewards, name="turn_mask")
    check_tensor("token_turn_ids", token_turn_ids, ndim=2)
    if token_turn_ids.is_floating_point() or token_turn_ids.dtype == torch.bool:
        raise ValueError(f"token_turn_ids has dtype {token_turn_ids.dtype}, expected an integer dtype")
    if token_turn_ids.shape[0] != G.shape[0]:
        raise ValueError(
            f"token_turn_ids has shape [{token_turn_ids.shape[0]}, {token_turn_ids.shape[1]}], "
            f"expected [{G.shape[0]}, T] like turn_rewards"
        )
    K = G.shape[1]
    if bool(((token_turn_ids < -1) | (token_turn_ids >= K)).any()):
        raise ValueError(f"token_turn_ids has values outside [-1, {K - 1}] (K = {K} turns in turn_rewards)")
    inside = token_turn_ids >= 0
    idx = token_turn_ids.clamp_min(0).long()
    if bool((inside & ~torch.gather(tm, 1, idx)).any()):
        raise ValueError("token_turn_ids points at turns where turn_mask is 0")
    if normalize:
        flat = G[tm]
        A = normalize_rewards(
            flat, torch.zeros_like(flat, dtype=torch.long), mean_scope="batch", std_scope="batch", eps=eps, unbiased=unbiased
        )
        G = torch.zeros_like(G).masked_scatter(tm, A)
    return masked_fill_zero(torch.gather(G, 1, idx), inside)


rebn = register_advantage_estimator("rebn", inputs="turn_rewards")(rebn)
