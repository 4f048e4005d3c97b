"""Random inputs for the policy-loss tests (float64, reproducible from a torch.Generator)."""

from __future__ import annotations

import torch

COMMON_CORRECTIONS = {
    "none": {},
    "metrics_only": {"correction": None},
    "tis_token": {"correction": "tis", "correction_level": "token", "correction_cap": 1.1},
    "tis_sequence": {"correction": "tis", "correction_level": "sequence", "correction_cap": 1.3},
    "mis_token": {"correction": "mis", "correction_level": "token", "correction_low": 0.8, "correction_high": 1.2},
    "mis_sequence": {"correction": "mis", "correction_level": "sequence", "correction_low": 0.6, "correction_high": 1.6},
    "mis_geometric": {"correction": "mis", "correction_level": "geometric", "correction_low": 0.9, "correction_high": 1.1},
}


def make_mask(B, T, g, *, p_on=0.75, allow_empty_rows=True):
    """Random bool mask; with allow_empty_rows, half the time one row is entirely masked out."""
    mask = torch.rand(B, T, generator=g) < p_on
    if not allow_empty_rows:
        mask[:, 0] = True
    elif B > 1 and bool(torch.rand((), generator=g) < 0.5):
        mask[int(torch.randint(0, B, (), generator=g))] = False  # an empty sequence
    return mask


def make_policy_inputs(B, T, g, *, log_ratio_scale=0.3, weights=False, rollout=False):
    log_probs = (-2 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = log_probs.detach() + log_ratio_scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = make_mask(B, T, g)
    kwargs = {}
    if weights:
        kwargs["weights"] = 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64)
    if rollout:
        kwargs["rollout_log_probs"] = old + 0.15 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return log_probs, old, advantages, mask, kwargs


def grad_of(loss, x):
    """d loss / d x, zeros when the loss does not depend on x (e.g. all tokens clipped)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g
