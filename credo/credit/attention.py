"""Preplan-and-anchor credit from attention maps (arXiv 2510.13554).

Heads are split by how far back they look (head span); the local heads give the Windowed Average
Attention Distance (WAAD, "preplan" tokens open a new local chunk), the global heads give the Future
Attention Influence (FAI, "anchor" tokens that later tokens keep attending to). The credit rules
rescale token advantages by a detached multiplier ``gamma_t``: ``A~_t = gamma_t * A_t`` (Eq. 12).

``attention`` arguments are ``[..., N, N]`` causal, row-stochastic maps (row = query ``t``, column
= key ``s``) of the full prompt+response sequence. For maps too large to hold, see
:mod:`credo.credit.streaming`, which computes the same quantities from query/key states.
"""

from __future__ import annotations

import torch

from credo.credit._select import apply_sign_mode, response_rows, top_fraction_mask

__all__ = [
    "head_span",
    "group_heads",
    "waad",
    "fai",
    "rhythm_gamma",
    "attention_rhythm_gamma",
    "RHYTHM_STRATEGIES",
]

RHYTHM_STRATEGIES = ("local", "global", "coupled")


def _check_square(attention: torch.Tensor, min_dim: int = 2) -> int:
    if attention.dim() < min_dim or attention.shape[-1] != attention.shape[-2]:
        expected = "[..., N, N]" if min_dim == 2 else "[H, N, N] or [L, H, N, N]"
        raise ValueError(f"attention has shape {list(attention.shape)}, expected {expected}")
    return attention.shape[-1]


def _mean_map(attention: torch.Tensor) -> torch.Tensor:
    n = _check_square(attention)
    return attention.reshape(-1, n, n).mean(dim=0)


def group_heads(span: torch.Tensor, quantile: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Split heads into local- and global-focused sets by their span (arXiv 2510.13554, Sec. 4).

    The ``quantile`` share of heads with the smallest span is local, the same share with the largest
    span is global (paper example: 30%). The count is the nearest integer to ``quantile * n_heads``,
    at least 1; ties are broken by head order. Grouping is over all given heads (all layers
    jointly). The paper does not say whether it is per sequence, per batch or fixed: it is per
    call here (per sequence when called per sequence).

    Args:
        span: ``[H]`` or ``[L, H]`` head spans from :func:`head_span` or
            :func:`credo.credit.streaming.streaming_head_stats`.
        quantile: share of heads in each group, in ``(0, 1]``.

    Returns:
        ``(local_heads, global_heads)``: bool masks shaped like ``span``.
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile={quantile}, expected a value in (0, 1]")
    flat = span.detach().reshape(1, -1)
    valid = torch.ones_like(flat, dtype=torch.bool)
    local = top_fraction_mask(flat, valid, quantile, largest=False)
    global_ = top_fraction_mask(flat, valid, quantile, largest=True)
    return local.reshape(span.shape), global_.reshape(span.shape)


def head_span(
    attention: torch.Tensor, response_mask: torch.Tensor | None = None, *, quantile: float = 0.3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention-weighted backward distance of each head and the local/global grouping (Eq. 7-8).

        d^(l,h) = 1/|R| * sum_{t in R} sum_{s <= t} A^(l,h)[t, s] * (t - s)

    Args:
        attention: ``[H, N, N]`` or ``[L, H, N, N]`` causal row-stochastic maps.
        response_mask: ``[N]`` bool, the response rows ``R`` (all rows when None).
        quantile: share of heads in each group, see :func:`group_heads`.

    Returns:
        ``(span, local_heads, global_heads)``: ``span`` is ``attention.shape[:-2]`` float (0 when
        the response is empty); the two bool masks have the same shape.
    """
    n = _check_square(attention, min_dim=3)
    rows = response_rows(response_mask, torch.Size([n]), attention.device)
    t = torch.arange(n, device=attention.device, dtype=attention.dtype)
    distance = (t[:, None] - t[None, :]).clamp(min=0)  # [N, N], 0 on and above the diagonal
    # One head at a time keeps the temporary at N x N instead of H x N x N.
    per_row = torch.stack([(a * distance).sum(dim=-1) for a in attention.reshape(-1, n, n)])
    per_row = per_row.reshape(attention.shape[:-1])  # [..., N]
    span = (per_row * rows).sum(dim=-1) / rows.sum().clamp(min=1)
    local, global_ = group_heads(span, quantile)
    return span, local, global_


def waad(attention: torch.Tensor, window: int = 10) -> torch.Tensor:
    """Windowed Average Attention Distance (arXiv 2510.13554, Def. 4.1, Eq. 9).

        WAAD_t = sum_{s <= t} Abar[t, s] * min(t - s, W)

    ``Abar`` is ``attention`` averaged over its leading dimensions (pass the local-head maps).

    Args:
        attention: ``[..., N, N]`` causal row-stochastic maps.
        window: ``W`` (paper default 10, best in its Table 7b sweep).

    Returns:
        ``[N]`` WAAD of every row.
    """
    if window < 0:
        raise ValueError(f"window={window}, expected a non-negative int")
    mean = _mean_map(attention)
    n = mean.shape[-1]
    t = torch.arange(n, device=mean.device, dtype=mean.dtype)
    weight = (t[:, None] - t[None, :]).clamp(min=0, max=window)
    return (mean * weight).sum(dim=-1)


def fai(
    attention: torch.Tensor,
    response_mask: torch.Tensor | None = None,
    h_lo: int = 10,
    h_hi: int = 100,
) -> torch.Tensor:
    """Future Attention Influence (arXiv 2510.13554, Def. 4.2, Eq. 10).

        T(s)  = { t in R : s + h_lo <= t <= min(N - 1, s + h_hi) }
        FAI_s = 1/|T(s)| * sum_{t in T(s)} Abar[t, s]      (0 when T(s) is empty; inferred)

    ``Abar`` is ``attention`` averaged over its leading dimensions (pass the global-head maps).
    Defaults ``h_lo=10, h_hi=100`` are the revised paper's best setting (v1 used ``h_hi`` up to 50).

    Args:
        attention: ``[..., N, N]`` causal row-stochastic maps.
        response_mask: ``[N]`` bool, the response rows ``R`` (all rows when None).
        h_lo, h_hi: horizon of the future rows that count.

    Returns:
        ``[N]`` FAI of every column (token) ``s``.
    """
    if not 0 <= h_lo <= h_hi:
        raise ValueError(f"h_lo={h_lo}, h_hi={h_hi}, expected 0 <= h_lo <= h_hi")
    mean = _mean_map(attention)
    n = mean.shape[-1]
    rows = response_rows(response_mask, torch.Size([n]), mean.device)
    t = torch.arange(n, device=mean.device)
    ahead = t[:, None] - t[None, :]  # [t, s] -> t - s
    in_horizon = (ahead >= h_lo) & (ahead <= h_hi) & rows[:, None]
    total = torch.where(in_horizon, mean, torch.zeros_like(mean)).sum(dim=0)
    count = in_horizon.sum(dim=0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def _window_max(
    delta: torch.Tensor, rows: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Max and argmax of ``delta[u]`` over response tokens ``u`` in ``{t-k, ..., t-1}``.

    Returns ``(max [..., N], argmax [..., N])``; ``max`` is -inf where the window holds no
    response token. Ties go to the token closest to ``t``.
    """
    n = delta.shape[-1]
    t = torch.arange(n, device=delta.device)
    best = torch.full_like(delta, -float("inf"))
    best_at = torch.zeros(delta.shape, dtype=torch.long, device=delta.device)
    for offset in range(1, k + 1):  # k is 1..3
        u = t - offset
        ok = u >= 0
        u_safe = u.clamp(min=0).expand_as(delta)
        usable = ok & rows.gather(-1, u_safe)
        candidate = torch.where(usable, delta.gather(-1, u_safe), -float("inf"))
        better = candidate > best
        best = torch.where(better, candidate, best)
        best_at = torch.where(better, u_safe, best_at)
    return best, best_at


def rhythm_gamma(
    waad: torch.Tensor,
    fai: torch.Tensor | None,
    *,
    strategy: str = "coupled",
    response_mask: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    sign_mode: str = "both",
    q: float = 0.4,
    gamma_amp: float = 1.5,
    k: int = 3,
    alpha: float = 0.5,
    tau_waad: float | None = None,
    tau_delta: float | None = None,
) -> torch.Tensor:
    """Advantage multipliers of the preplan-and-anchor credit rules (arXiv 2510.13554, Sec. 5).

    With ``Delta_t = |WAAD_t - WAAD_{t+1}|`` (0 when ``t + 1`` is not a response token) and
    ``g = gamma_amp - 1``:

    - ``"local"`` (Eq. 13-14): ``gamma_t = 1 + g * 1[t in TopQ(Delta)]`` (preplan tokens).
    - ``"global"`` (Eq. 15-16): ``gamma_t = 1 + g * 1[t in TopQ(FAI)]`` (anchor tokens).
    - ``"coupled"`` (Eq. 17-19): an anchor ``t in TopQ(FAI)`` is locally dominated (``t in D``) if
      ``WAAD_t <= tau_waad`` and ``max_{u in t-k..t-1} Delta_u >= tau_delta``; its introductory
      token ``intro(t)`` is the ``u`` attaining that max. Then

          gamma_t = 1 + g * 1[t in TopQ(FAI) \\ D] + (1 - alpha) * g * 1[t in D]
                      + alpha * g * 1[t in {intro(s) : s in D}]

      (bonuses add, the literal reading of Eq. 18).

    ``TopQ`` selects the nearest-integer ``q`` share of the response tokens of each row (ties by
    position). Inferred details, exposed as keywords: ``tau_waad`` defaults to the lower median of
    WAAD over the response, ``tau_delta`` to the smallest ``Delta`` inside ``TopQ(Delta)`` (so
    "large jump" means "would be a local-chunk token"), ``alpha=0.5``, ``k=3`` (paper: k in 1..3),
    ``intro(t)`` ties go to the token closest to ``t``; window tokens outside the response are
    skipped. Paper constants: ``q=0.4``, ``gamma_amp=1.5``; ``sign_mode="both"`` (revised paper,
    Table 7a; v1 applied it to non-negative advantages only, ``"positive"``).

    Args:
        waad: ``[..., N]`` WAAD of the local-head map (from :func:`waad`).
        fai: ``[..., N]`` FAI of the global-head map (from :func:`fai`); may be None for
            ``"local"``.
        strategy: ``"local"``, ``"global"`` or ``"coupled"``.
        response_mask: ``[..., N]`` bool, the selectable tokens (all when None).
        advantages: ``[..., N]`` advantages; needed only for ``sign_mode != "both"``.
        sign_mode: ``"both"``, ``"positive"`` or ``"negative"``: the advantage signs to rescale.
        q: selected share of response tokens.
        gamma_amp: amplification factor.
        k: look-back window of the coupled rule.
        alpha: share of a dominated anchor's bonus moved to its introductory token.
        tau_waad, tau_delta: thresholds of the coupled rule (None: the defaults above).

    Returns:
        ``[..., N]`` detached multipliers, 1 outside the response. Range: ``{1, gamma_amp}`` for
        ``"local"``/``"global"``; ``[1, 1 + (1 + alpha) * g]`` for ``"coupled"`` (when
        ``gamma_amp >= 1``).
    """
    if strategy not in RHYTHM_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}, expected one of {RHYTHM_STRATEGIES}")
    if k < 1:
        raise ValueError(f"k={k}, expected a look-back window of at least 1 token")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha}, expected a value in [0, 1]")
    waad = waad.detach()
    if strategy != "local":
        if fai is None or fai.shape != waad.shape:
            got = None if fai is None else list(fai.shape)
            raise ValueError(f"fai has shape {got}, expected {list(waad.shape)} like waad")
        fai = fai.detach().to(waad.dtype)
    rows = response_rows(response_mask, waad.shape, waad.device)
    g = gamma_amp - 1.0

    next_in_response = torch.zeros_like(rows)
    next_in_response[..., :-1] = rows[..., 1:] & rows[..., :-1]
    next_waad = torch.roll(waad, shifts=-1, dims=-1)
    delta = torch.where(next_in_response, (waad - next_waad).abs(), torch.zeros_like(waad))

    if strategy == "local":
        gamma = 1.0 + g * top_fraction_mask(delta, rows, q).to(waad.dtype)
    elif strategy == "global":
        gamma = 1.0 + g * top_fraction_mask(fai, rows, q).to(waad.dtype)
    else:
        anchors = top_fraction_mask(fai, rows, q)
        if tau_waad is None:
            masked = torch.where(rows, waad, torch.full_like(waad, float("nan")))
            tau_w = masked.nanmedian(dim=-1, keepdim=True).values
        else:
            tau_w = torch.full_like(waad[..., :1], tau_waad)
        if tau_delta is None:
            local = top_fraction_mask(delta, rows, q)
            tau_d = torch.where(local, delta, torch.full_like(delta, float("inf")))
            tau_d = tau_d.min(dim=-1, keepdim=True).values
        else:
            tau_d = torch.full_like(waad[..., :1], tau_delta)
        jump, intro = _window_max(delta, rows, k)
        dominated = anchors & (waad <= tau_w) & (jump >= tau_d)
        # A token is introductory if at least one dominated anchor points to it.
        hits = torch.zeros(waad.shape, dtype=waad.dtype, device=waad.device)
        hits.scatter_add_(-1, intro, dominated.to(waad.dtype))
        introductory = (hits > 0) & rows
        gamma = (
            1.0
            + g * (anchors & ~dominated).to(waad.dtype)
            + (1.0 - alpha) * g * dominated.to(waad.dtype)
            + alpha * g * introductory.to(waad.dtype)
        )
    gamma = torch.where(rows, gamma, torch.ones_like(gamma))
    return apply_sign_mode(gamma, advantages, sign_mode).detach()


def attention_rhythm_gamma(
    attention: torch.Tensor,
    response_mask: torch.Tensor | None = None,
    *,
    strategy: str = "coupled",
    advantages: torch.Tensor | None = None,
    sign_mode: str = "both",
    head_quantile: float = 0.3,
    window: int = 10,
    h_lo: int = 10,
    h_hi: int = 100,
    q: float = 0.4,
    gamma_amp: float = 1.5,
    k: int = 3,
    alpha: float = 0.5,
    tau_waad: float | None = None,
    tau_delta: float | None = None,
) -> torch.Tensor:
    """Attention maps of one sequence -> advantage multipliers (arXiv 2510.13554, Eq. 7-19).

    Groups heads with :func:`head_span`, computes :func:`waad` on the local-head mean and
    :func:`fai` on the global-head mean, and applies :func:`rhythm_gamma`. The paper samples 5
    evenly spaced layers from the middle third of the network; pass those layers' maps.

    Args:
        attention: ``[H, N, N]`` or ``[L, H, N, N]`` causal row-stochastic maps of one sequence.
        response_mask: ``[N]`` bool response tokens (all when None).
        The other keywords are those of :func:`head_span` (``head_quantile``), :func:`waad`,
        :func:`fai` and :func:`rhythm_gamma`.

    Returns:
        ``[N]`` detached multipliers.
    """
    _, local, global_ = head_span(attention, response_mask, quantile=head_quantile)
    waad_t = waad(attention[local], window)
    fai_t = fai(attention[global_], response_mask, h_lo, h_hi)
    return rhythm_gamma(
        waad_t,
        fai_t,
        strategy=strategy,
        response_mask=response_mask,
        advantages=advantages,
        sign_mode=sign_mode,
        q=q,
        gamma_amp=gamma_amp,
        k=k,
        alpha=alpha,
        tau_waad=tau_waad,
        tau_delta=tau_delta,
    )
