"""Policy-gradient losses, registered by name for recipes (``algo.policy_loss: <name>``).

One file past 400 lines on purpose, as verl's ``core_algos.py``: every registered loss side by side, so a reader
compares PPO, CISPO, TOPR and the rest in one place; each is a short function of tensors.

Contract of a registry entry (what :func:`register_policy_loss` expects)::

    fn(log_probs, old_log_probs, advantages, mask, **kwargs) -> (loss, metrics)

- ``log_probs`` ``[B, T]``: log pi_theta of the sampled tokens (with grad);
  ``old_log_probs`` ``[B, T]``: log pi_old (detached); ``advantages`` ``[B, T]`` (detached);
  ``mask`` ``[B, T]`` bool or 0/1 floating.
- ``loss``: 0-d tensor to *minimise*; ``metrics``: ``dict[str, float | 0-d tensor]``.
- Common keywords every built-in loss accepts (the pipeline passes them uniformly):
  ``weights`` (``[B, T]``, multiplies the per-token loss, e.g. credit-assignment weights; they
  reach the loss through the objective stage's ``weights=``),
  ``rollout_log_probs`` (``[B, T]`` log mu of the sampler) with ``correction`` (None | ``"tis"`` |
  ``"mis"``), ``correction_level`` (``"token"`` | ``"sequence"`` | ``"geometric"``),
  ``correction_cap``, ``correction_low``, ``correction_high`` (see
  :func:`credo.algos.corrections.train_infer_correction`), ``behaviour_ratio`` (the ratio against mu instead of
  pi_old), and ``agg_mode``, ``global_tokens``,
  ``global_seqs``, ``norm_len`` (see :func:`credo.algos.aggregation.aggregate`).

The easy way to satisfy the contract is to write only the per-token loss and wrap it with
:func:`per_token_policy_loss`, which adds validation, masking, ``weights``, the train/inference
correction, aggregation and the ratio metrics::

    @register_policy_loss("my_loss")
    @per_token_policy_loss
    def my_loss(log_probs, old_log_probs, advantages, mask, *, my_coef=1.0):
        # inputs are validated, detached where they should be, and zero outside `mask`
        return -my_coef * advantages * log_probs, {}

All losses here clamp log-ratios to [-20, 20] before ``exp`` (see ``LOG_RATIO_CLAMP``). The module is a
few lines over 400 because each loss registers by a call after its ``def`` (mutmut skips decorated
functions); the planned split moves :func:`per_token_policy_loss` and its checks to a module of their own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch

from credo.algos._validate import (
    LOG_RATIO_CLAMP,
    as_bool_mask,
    check_choice,
    check_finite,
    check_like,
    check_tensor,
    masked_fill_zero,
    register,
)
from credo.algos.aggregation import AGG_MODES, aggregate, masked_mean
from credo.algos.corrections import _correction

POLICY_LOSSES: dict[str, Callable] = {}


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator recording a policy loss in :data:`POLICY_LOSSES` under ``name``.

    The decorated function must follow the module's contract (see the module docstring) and is
    returned unchanged. Registering a *different* function under a taken name raises ValueError;
    re-registering the same function (a module reload) is allowed.
    """
    return lambda fn: register(POLICY_LOSSES, "policy loss", name, fn)


def log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """``log pi_theta - log pi_old`` clamped to [-20, 20] (exp stays finite in fp32)."""
    return (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def per_token_policy_loss(token_loss_fn: Callable) -> Callable:
    """Turns a per-token loss into a full policy loss following the registry contract.

    ``token_loss_fn(log_probs, old_log_probs, advantages, mask, **kwargs) -> (token_loss [B, T],
    metrics)`` receives ``mask`` as bool, ``old_log_probs``/``advantages`` detached, and all three
    tensors set to 0 outside the mask (so NaN/Inf there cannot leak). The wrapper then computes

        loss = aggregate(token_loss * weights * w_correction, mask, agg_mode, ...)

    With ``behaviour_ratio=True`` the kernel's ``old_log_probs`` is the sampler's ``rollout_log_probs`` (mu): its
    ratio is pi_theta / mu, as ROLL computes it without the old-log-prob recompute (ROLL Flash, arXiv 2510.11345),
    so TOPR's and CISPO's truncated IS weights correct for a stale behaviour policy in asynchronous training.

    and adds ``ratio_mean/max/min`` (pi_theta/pi_old over masked tokens; 1 when the mask is
    empty) and the correction metrics to the kernel's metrics (a kernel metric of the same name
    wins, e.g. a chunk ratio). Extra keywords go to the kernel. A kernel that declares a
    ``rollout_log_probs`` keyword also receives the sampler log-probs (validated, detached, 0
    outside the mask, or None), e.g. to drop chunks whose train/inference mismatch is too large.

    Raises:
        ValueError: wrong shapes/dtypes (naming the argument), non-finite values in masked-in
            positions of log_probs, old_log_probs, advantages, weights or rollout_log_probs, or
            ``correction`` set without ``rollout_log_probs``.
    """

    wants_rollout = "rollout_log_probs" in inspect.signature(token_loss_fn).parameters

    @functools.wraps(token_loss_fn)
    def loss_fn(
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        weights: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        correction: str | None = None,
        correction_level: str = "token",
        correction_cap: float = 2.0,
        correction_low: float = 0.5,
        correction_high: float = 2.0,
        behaviour_ratio: bool = False,
        agg_mode: str = "token-mean",
        global_tokens=None,
        global_seqs=None,
        norm_len: int | float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        check_tensor("log_probs", log_probs, ndim=2, floating=True)
        check_like("old_log_probs", old_log_probs, "log_probs", log_probs)
        check_like("advantages", advantages, "log_probs", log_probs)
        m = as_bool_mask(mask, "log_probs", log_probs)
        check_choice("agg_mode", agg_mode, AGG_MODES)
        check_finite("log_probs", log_probs, m)
        check_finite("old_log_probs", old_log_probs, m)
        check_finite("advantages", advantages, m)
        lp = masked_fill_zero(log_probs, m)
        old = masked_fill_zero(old_log_probs.detach(), m)
        adv = masked_fill_zero(advantages.detach(), m)

        rollout = None
        if rollout_log_probs is not None:
            check_like("rollout_log_probs", rollout_log_probs, "log_probs", log_probs)
            check_finite("rollout_log_probs", rollout_log_probs, m)
            rollout = masked_fill_zero(rollout_log_probs.detach(), m)
        elif correction is not None:
            raise ValueError(f"correction={correction!r} needs rollout_log_probs (log-probs of the sampler)")
        if behaviour_ratio:  # ROLL without the old-log-prob recompute: the kernel's ratio is pi_theta / mu
            if rollout is None or correction is not None:
                raise ValueError("behaviour_ratio=True needs rollout_log_probs and no correction (the ratio is taken "
                                 f"against the sampler's log-probs already), got correction={correction!r}")
            old = rollout
        if wants_rollout:
            kwargs["rollout_log_probs"] = rollout

        token_loss, kernel_metrics = token_loss_fn(lp, old, adv, m, **kwargs)
        metrics = _ratio_metrics(lp.detach(), old, m)

        w = None
        if weights is not None:
            check_like("weights", weights, "log_probs", log_probs)
            check_finite("weights", weights, m)
            w = masked_fill_zero(weights, m)
        if rollout is not None:
            cw, _, cmetrics = _correction(
                old,
                rollout,
                m,
                mode=correction,
                level=correction_level,
                cap=correction_cap,
                low=correction_low,
                high=correction_high,
            )
            metrics.update(cmetrics)
            if correction is not None:
                w = cw if w is None else w * cw
        if w is not None:
            token_loss = token_loss * w

        loss = aggregate(
            token_loss, m, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len
        )
        metrics.update(kernel_metrics)
        return loss, metrics

    return loss_fn


def _ratio_metrics(lp, old, m):
    return ratio_summary(log_ratio(lp, old).exp(), m)


def ratio_summary(ratio: torch.Tensor, m: torch.Tensor) -> dict[str, torch.Tensor]:
    """``ratio_mean/max/min`` of ``ratio [B, T]`` over the bool mask ``m`` (all 1 for an empty mask)."""
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    any_token = m.any()
    return {
        "ratio_mean": torch.where(any_token, masked_mean(ratio, m), one),
        "ratio_max": torch.where(any_token, torch.where(m, ratio, -torch.inf).max(), one),
        "ratio_min": torch.where(any_token, torch.where(m, ratio, torch.inf).min(), one),
    }


def _frac(flags: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (flags & m).sum().float() / m.sum().clamp_min(1).float()


def _clip_metrics(ratio, adv, m, low_bound, high_bound):
    """Fractions of masked tokens where the clip is active (its gradient is zero)."""
    with torch.no_grad():
        return {
            "clipfrac_low": _frac((adv < 0) & (ratio < low_bound), m),
            "clipfrac_high": _frac((adv > 0) & (ratio > high_bound), m),
        }


def ppo(log_probs, old_log_probs, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None):
    """PPO clipped surrogate with asymmetric clip and optional dual clip (arXiv 1707.06347).

    ``r_t = exp(log_probs - old_log_probs)``; per token (minimised)::

        l_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)
        dual clip (A_t < 0, constant c > 1):  l_t = min(l_t, -c A_t)     (arXiv 1912.09729)

    ``clip_high > clip_low`` is DAPO's clip-higher (arXiv 2503.14476). The dual clip is **off by
    default** here (``dual_clip=None``), while verl always applies it with ``c = 3``
    (``clip_ratio_c``); pass ``dual_clip=3.0`` to match verl. ROLL uses ``c = 1 + 2 * clip``
    (1.4 at 0.2); the dual-clip paper uses ``c = 3``. With
    ``rollout_log_probs`` and ``correction="tis"`` this is decoupled PPO (clip around pi_old,
    weight min(pi_old / mu, cap)).

    Args (besides the common ones, see module docstring):
        log_probs, old_log_probs, advantages, mask: ``[B, T]``.
        clip_low, clip_high: clip epsilons (ratio kept in ``[1 - clip_low, 1 + clip_high]``).
        dual_clip: the constant ``c`` (> 1), or None (default) for no dual clip (verl: always 3).

    Metrics: ``clipfrac_low`` (A<0 and r<1-clip_low), ``clipfrac_high`` (A>0 and r>1+clip_high),
    ``dual_clipfrac`` (A<0 tokens bounded by the dual clip), plus the ratio metrics.
    """
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip is {dual_clip!r}, expected a constant > 1 or None")
    ratio = log_ratio(log_probs, old_log_probs).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = _clip_metrics(ratio.detach(), advantages, mask, 1 - clip_low, 1 + clip_high)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (bound < loss)
        loss = torch.where(dual, bound, loss)
        metrics["dual_clipfrac"] = _frac(dual.detach(), mask)
    return loss, metrics


ppo = register_policy_loss("ppo")(per_token_policy_loss(ppo))


def reinforce(log_probs, old_log_probs, advantages, mask):
    """Vanilla policy gradient (REINFORCE, Williams 1992): ``l_t = -A_t log pi_theta(a_t)``.

    ``old_log_probs`` only feeds the ratio metrics (and the correction, if any).
    """
    return -advantages * log_probs, {}


reinforce = register_policy_loss("reinforce")(per_token_policy_loss(reinforce))


def gspo(log_probs, old_log_probs, advantages, mask, *, clip_low=3e-4, clip_high=4e-4):
    """GSPO: clipped surrogate on the length-normalised sequence ratio (arXiv 2507.18071).

    ``s_i = exp(mean_t (log pi_theta - log pi_old))`` over the masked tokens of sequence ``i``.
    The GSPO-token form (paper Sec. 4.3) is implemented, which allows per-token advantages::

        s_it = sg[s_i] * pi_theta(a_it) / sg[pi_theta(a_it)]
        l_it = -min(s_it A_it, clip(s_it, 1 - clip_low, 1 + clip_high) A_it)

    Its value equals ``s_i`` and, with a constant advantage per sequence and ``agg_mode=
    "seq-mean-token-mean"`` (the paper's ``1/G sum_i``), its gradient equals sequence-level GSPO's.
    Defaults ``clip_low=3e-4, clip_high=4e-4`` are the paper's. The common default
    ``agg_mode="token-mean"`` weights sequences by length; recipes reproducing the paper set
    ``agg_mode: seq-mean-token-mean``.

    Metrics: ``clipfrac_low``/``clipfrac_high`` (tokens whose sequence ratio is clipped).
    """
    n = mask.sum(-1).clamp_min(1).to(log_probs.dtype)
    seq_log_ratio = (log_probs - old_log_probs).sum(-1) / n  # zero outside mask already
    log_s = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    s = log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    loss = torch.maximum(-advantages * s, -advantages * s.clamp(1 - clip_low, 1 + clip_high))
    return loss, _clip_metrics(s.detach(), advantages, mask, 1 - clip_low, 1 + clip_high)


gspo = register_policy_loss("gspo")(per_token_policy_loss(gspo))


def cispo(log_probs, old_log_probs, advantages, mask, *, clip_low=1.0, clip_high=4.0):
    """CISPO: REINFORCE with a clipped, detached IS weight (MiniMax-M1, arXiv 2506.13585 Eq. 4)::

        l_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] A_t log pi_theta(a_t)

    Every token keeps a gradient (the weight is clipped, not the update). Defaults: M1 "did not
    impose a lower bound" (``clip_low=1.0`` -> lower bound 0) and tuned only the upper one; its
    value is not stated in what we read, ``clip_high=4.0`` is *inferred* (ScaleRL's choice).
    ROLL's defaults are 0.1 / 0.1.

    Metrics: ``clipfrac_low``/``clipfrac_high`` = fractions of masked tokens whose weight is
    truncated below/above (regardless of the advantage sign).
    """
    ratio = log_ratio(log_probs, old_log_probs).exp().detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    metrics = {
        "clipfrac_low": _frac(ratio < 1 - clip_low, mask),
        "clipfrac_high": _frac(ratio > 1 + clip_high, mask),
    }
    return -weight * advantages * log_probs, metrics


cispo = register_policy_loss("cispo")(per_token_policy_loss(cispo))


def topr(
    log_probs,
    old_log_probs,
    advantages,
    mask,
    *,
    scores=None,
    positive_weight=1.0,
    negative_weight=1.0,
    ratio_level="token",
):
    """TOPR, tapered off-policy REINFORCE (arXiv 2503.14286 Eq. 8, as ROLL implements it)::

        positive sequences (score > 0):  l_t = -w_+ A_t log pi_theta(a_t)
        negative sequences (score <= 0): l_t = -w_- sg[clip(r, 0, 1)] A_t log pi_theta(a_t)

    Positive samples get SFT-like updates with no IS weight; negative ones a truncated IS weight.

    Args (besides the common ones):
        scores: ``[B]`` sequence scores (rewards) splitting positives from negatives. When None,
            a sequence is positive iff the sum of its masked advantages is > 0.
        positive_weight, negative_weight: ``w_+`` and ``w_-`` (ROLL defaults 1.0).
        ratio_level: ``"token"`` (ROLL: ``r_t = pi_theta(a_t)/pi_old(a_t)``) or ``"sequence"``
            (the paper's trajectory ratio ``prod_t r_t``, clamped in log space).

    Metrics: ``positive_frac`` (fraction of non-empty sequences that are positive) and
    ``truncated_frac`` (fraction of masked tokens in negative sequences with ratio > 1).
    """
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level is {ratio_level!r}, expected 'token' or 'sequence'")
    if scores is None:
        positive = advantages.sum(-1) > 0
    else:
        check_tensor("scores", scores, ndim=1)
        if scores.shape[0] != log_probs.shape[0]:
            raise ValueError(f"scores has shape [{scores.shape[0]}], expected [{log_probs.shape[0]}] like log_probs")
        check_finite("scores", scores)
        positive = scores > 0
    diff = log_probs - old_log_probs
    if ratio_level == "sequence":
        diff = diff.sum(-1, keepdim=True).expand_as(diff)
    ratio = diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().detach()
    pos = positive.unsqueeze(-1)
    coef = torch.where(pos, positive_weight, negative_weight * ratio.clamp(max=1.0))
    nonempty = mask.any(-1)
    metrics = {
        "positive_frac": (positive & nonempty).sum().float() / nonempty.sum().clamp_min(1).float(),
        "truncated_frac": _frac(~pos & (ratio > 1), mask),
    }
    return -coef * advantages * log_probs, metrics


topr = register_policy_loss("topr")(per_token_policy_loss(topr))


def sapo(log_probs, old_log_probs, advantages, mask, *, tau_pos=1.0, tau_neg=1.05):
    """SAPO: soft adaptive policy optimisation, a sigmoid gate instead of the hard clip
    (Gao et al., arXiv 2511.20347)::

        tau_t = tau_pos if A_t > 0 else tau_neg
        f(r)  = (4 / tau_t) sigmoid(tau_t (r_t - 1))
        l_t   = -f(r_t) A_t

    The gradient weight relative to ``grad r`` is ``4 sigmoid(x)(1 - sigmoid(x))``,
    ``x = tau (r - 1)``: 1 on-policy, decaying smoothly as the ratio moves away; ``tau_neg >
    tau_pos`` makes negative-advantage tokens decay faster. Defaults ``tau_pos=1.0,
    tau_neg=1.05`` are the paper's reported setting as we recall it (*inferred*; the same values
    are used by other public implementations). Token-level ratio as in the paper; the paper
    averages per sequence (``agg_mode: seq-mean-token-mean`` in a faithful recipe).

    Metrics: ``gate_weight_mean`` (token mean of the gradient weight above).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos!r} and {tau_neg!r}")
    ratio = log_ratio(log_probs, old_log_probs).exp()
    full = functools.partial(torch.full_like, ratio)
    tau = torch.where(advantages > 0, full(tau_pos), full(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    with torch.no_grad():
        metrics = {"gate_weight_mean": masked_mean(4 * gate * (1 - gate), mask)}
    return -(4 / tau) * gate * advantages, metrics


sapo = register_policy_loss("sapo")(per_token_policy_loss(sapo))


def kimi15(log_probs, old_log_probs, advantages, mask, *, tau=0.1):
    """Kimi k1.5 policy-mirror-descent surrogate (arXiv 2501.12599 Eq. 3, ROLL's token form)::

        l_t = -A_t log pi_theta(a_t) + (tau / 2) (log pi_theta(a_t) - log pi_old(a_t))^2

    The squared log-ratio is a token-level proxy for the paper's KL(pi_theta || pi_old)
    regulariser; ``tau = 0.1`` as in ROLL.
    """
    diff = log_probs - old_log_probs
    return -advantages * log_probs + 0.5 * tau * diff * diff, {}


kimi15 = register_policy_loss("kimi15")(per_token_policy_loss(kimi15))
