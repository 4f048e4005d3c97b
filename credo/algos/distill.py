"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the student is
pushed down the per-token reverse KL to the teacher.

With ``y_t`` the student's sampled token at position t and

    d_t = log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t)            (:func:`reverse_kl_log_ratio`)

``d_t`` is the single-sample estimate of the per-token reverse KL ``KL(pi_student || pi_teacher)`` at t (the k1
estimator: unbiased, since y_t ~ pi_student). Two ways to train on it:

- **reward form** (Thinking Machines, "On-Policy Distillation", 2025, thinkingmachines.ai/blog/on-policy-distillation):
  the per-token advantage is ``-d_t`` (:func:`distill_advantages`; they use discount 0, each token its own return;
  ``discount > 0`` sums the later tokens' ``-d`` too), fed to the ordinary policy loss (importance-weighted, with
  pi_student = the sampler's log-probs). :func:`mix_advantages` mixes it with an outcome-reward advantage.
- **loss-term form**: ``aggregate(d_t^2 / 2)`` added to the policy loss with a coefficient (:func:`distill_kl_loss`).
  Its gradient, ``d_t * grad log pi_student(y_t)``, is on-policy the exact gradient of the per-token reverse KL
  ``sum_v pi(v) (log pi(v) - log pi_T(v))`` in expectation over y_t (tests/algos/test_distill.py checks this against
  autograd of the exact sum). Adding ``d_t`` itself (k1) as a loss term would be wrong: its gradient
  ``grad log pi(y_t)`` is 0 in expectation.

GKD (Agarwal et al., arXiv 2306.13649) is the same on-policy setting with a full-vocabulary divergence (generalised
JSD; its reverse-KL end is this loss's expectation) computed from both models' whole distributions at each position;
this module uses the sampled-token form (one teacher log-prob per token), as Thinking Machines do.

Shapes: every per-token tensor is ``[B, T]`` (label-aligned), ``mask`` ``[B, T]`` bool, True on the tokens that
train. Imports only torch.
"""

from __future__ import annotations

import torch

from credo.algos._validate import as_bool_mask, check_like, check_tensor, masked_fill_zero
from credo.algos.aggregation import aggregate

__all__ = ["distill_advantages", "distill_kl_loss", "mix_advantages", "reverse_kl_log_ratio"]


def reverse_kl_log_ratio(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
    """Per-token reverse-KL estimate ``d = log pi_student(y_t) - log pi_teacher(y_t)``, 0 off the mask.

    Args:
        student_log_probs: [B, T] float, the student's log-prob of each sampled token (the sampler's, or
            recomputed; gradients flow through it).
        teacher_log_probs: [B, T] float, the teacher's log-prob of the same tokens (detached here).
        mask: [B, T] bool or 0/1 float.
    Returns:
        [B, T] float; values (and NaN/Inf) off the mask cannot leak.
    """
    check_tensor("student_log_probs", student_log_probs, ndim=2, floating=True)
    check_like("teacher_log_probs", teacher_log_probs, "student_log_probs", student_log_probs)
    m = as_bool_mask(mask, "student_log_probs", student_log_probs)
    return masked_fill_zero(student_log_probs, m) - masked_fill_zero(teacher_log_probs.detach(), m)


def distill_advantages(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor, *,
                       discount: float = 0.0) -> torch.Tensor:
    """The reward form's per-token advantage (Thinking Machines 2025): ``A_t = -sum_{k >= t} discount^(n(k)-n(t)) d_k``
    over the masked tokens of the row, where n counts masked tokens (unmasked gaps, e.g. an env's tokens in a
    multi-turn row, neither add nor discount). ``discount = 0`` (theirs): ``A_t = -d_t``; 1: the undiscounted sum.

    Args:
        student_log_probs, teacher_log_probs, mask: as :func:`reverse_kl_log_ratio`.
        discount: in [0, 1].
    Returns:
        [B, T] float, detached (an advantage), 0 off the mask.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount = {discount}, expected a number in [0, 1]")
    d = reverse_kl_log_ratio(student_log_probs.detach(), teacher_log_probs, mask)
    m = as_bool_mask(mask, "student_log_probs", student_log_probs)
    if discount == 0.0:
        return -d
    if discount == 1.0:  # reverse cumulative sum; gaps hold 0 so they add nothing
        return -masked_fill_zero(d.flip(-1).cumsum(-1).flip(-1), m)
    out = torch.zeros_like(d)
    acc = torch.zeros_like(d[:, 0])
    for t in range(d.shape[1] - 1, -1, -1):  # a gap keeps the running return as it is
        acc = torch.where(m[:, t], d[:, t] + discount * acc, acc)
        out[:, t] = acc
    return -masked_fill_zero(out, m)


def mix_advantages(outcome: torch.Tensor, distill: torch.Tensor, weight: float) -> torch.Tensor:
    """``(1 - weight) * outcome + weight * distill``, [B, T]: weight 1 is pure distillation (Thinking Machines),
    0 the outcome reward's advantage alone."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight = {weight}, expected a number in [0, 1]")
    check_like("distill", distill, "outcome", outcome)
    if weight == 0.0:
        return outcome
    if weight == 1.0:
        return distill.to(outcome.dtype)
    return (1.0 - weight) * outcome + weight * distill.to(outcome.dtype)


def distill_kl_loss(log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor, *,
                    agg_mode: str = "token-mean", global_tokens=None, global_seqs=None,
                    norm_len: int | float | None = None) -> torch.Tensor:
    """The loss-term form: ``aggregate(d_t^2 / 2, mask, agg_mode)`` with ``d = log pi_theta - log pi_teacher``.

    Aggregated by :func:`credo.algos.aggregate` with the caller's global counts, so micro-batch losses sum to the
    full-batch loss whatever the split; an empty mask gives 0 (finite, zero gradient).

    Args:
        log_probs: [B, T] float, the current policy's log-probs of the sampled tokens (with grad).
        teacher_log_probs: [B, T] float, detached. mask: [B, T] bool.
    Returns:
        0-d tensor.
    """
    d = reverse_kl_log_ratio(log_probs, teacher_log_probs, mask)
    return aggregate(0.5 * d * d, mask, agg_mode, global_tokens=global_tokens, global_seqs=global_seqs,
                     norm_len=norm_len)
