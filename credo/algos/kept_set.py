"""Kept sets of truncated samplers (top-k, top-p, min-p) and log-probs renormalised over them.

A truncated sampler draws from mu(y) = p(y) / S over its kept set K (S = p(K), the kept mass), so the
sampler's log-prob of y is log p(y) - log S while the trainer's full-softmax log-prob is log p(y): the
importance ratio pi / mu is off by log S (docs/truncated_sampling.md). Renormalising the trainer's
distribution over the same K removes it: log pi_K(y) = z_y - logsumexp_{j in K} z_j.

Every set here is an *upper set* of the scaled logits z = logits / T, closed under ties: a token tied
with a kept token is kept. So one number per token defines K, its threshold tau relative to the row's
top logit:

    K = {j : z_j - max_i z_i >= tau}        (tau = -inf: nothing is cut)

tau sits halfway between the lowest kept and the highest dropped relative logit, so a second forward
whose logits differ by float noise (a KV-cached decode against a full-sequence forward) finds the same
set unless that gap is below the noise. Scoring adds the sampled token to K whatever its logit, so a
token is never given probability 0 by a forward that disagrees at the boundary.

Stage order matters only for top-p, whose mass is taken over what the stages before it kept:
Hugging Face applies temperature, top-k, top-p, min-p (`transformers` `_get_logits_processor`); vLLM
applies temperature, min-p, top-k, top-p (`vllm.v1.sample.sampler.Sampler.sample`). Both engines break
ties at the top-p boundary by their sort order; the sets here keep every tied token instead (credo's
hf sampler draws from exactly these sets, so what it records is what it used).
"""

from __future__ import annotations

import math

import torch

__all__ = ["ORDERS", "kept_log_probs", "kept_mask", "kept_set_threshold", "mask_outside_kept_"]

ORDERS = {"hf": ("top_k", "top_p", "min_p"), "vllm": ("min_p", "top_k", "top_p")}
"""The order each engine applies its truncations in, after the temperature."""


def _tie_closed(sorted_z: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The number of entries of each descending row `sorted_z [N, V]` that are >= its n-th (1-based) entry."""
    nth = sorted_z.gather(1, (n - 1).clamp(min=0)[:, None])
    return (sorted_z >= nth).sum(1)


def _top_p_count(sorted_z: torch.Tensor, live: torch.Tensor, top_p: float) -> torch.Tensor:
    """How many of the `live` leading entries the nucleus keeps: those whose mass ranked above them (within the
    live entries, renormalised) is below top_p; at least one."""
    q = sorted_z.masked_fill(~live, -math.inf).softmax(-1)
    mass_before = q.cumsum(-1) - q
    return ((mass_before < top_p) & live).sum(1).clamp(min=1)


def kept_set_threshold(z: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                       order: str = "hf") -> torch.Tensor:
    """The threshold tau of each row's kept set (see the module docstring).

    Args:
        z: [N, V] float, the scaled logits (logits / temperature) the sampler draws from.
        top_k: keep the k highest (and every token tied with the k-th); 0 = off.
        top_p: keep the most probable tokens while the mass ranked above them is below top_p; 1 = off.
        min_p: keep tokens with p >= min_p * max p, i.e. z - max z >= log(min_p); 0 = off.
        order: 'hf' or 'vllm', the engine whose stage order (what top-p's mass is taken over) to follow.

    Returns:
        tau: [N] float32, <= 0, or -inf where the rule cuts nothing; K = {j : z_j - max z >= tau}.
    """
    if order not in ORDERS:
        raise ValueError(f"order is {order!r}, expected one of {sorted(ORDERS)}")
    if z.dim() != 2:
        raise ValueError(f"z has shape {list(z.shape)}, expected [N, V]")
    n_rows, vocab = z.shape
    sorted_z = z.float().sort(-1, descending=True).values
    kept = torch.full((n_rows,), vocab, dtype=torch.long, device=z.device)
    for stage in ORDERS[order]:
        if stage == "top_k" and 0 < top_k < vocab:
            kept = torch.minimum(kept, _tie_closed(sorted_z, torch.full_like(kept, top_k)))
        elif stage == "min_p" and min_p > 0:
            rel = sorted_z - sorted_z[:, :1]
            kept = torch.minimum(kept, (rel >= math.log(min_p)).sum(1).clamp(min=1))
        elif stage == "top_p" and top_p < 1:
            live = torch.arange(vocab, device=z.device)[None, :] < kept[:, None]
            kept = torch.minimum(kept, _tie_closed(sorted_z, _top_p_count(sorted_z, live, top_p)))
    rel = sorted_z - sorted_z[:, :1]
    last_kept = rel.gather(1, (kept - 1)[:, None])[:, 0]
    first_dropped = rel.gather(1, kept.clamp(max=vocab - 1)[:, None])[:, 0]
    # -inf - inf halves to -inf: a dropped token already at -inf (a masked vocabulary entry) cuts nothing new
    tau = (last_kept + first_dropped) / 2
    return torch.where(kept < vocab, tau, torch.full_like(tau, -math.inf))


def kept_mask(z: torch.Tensor, tau: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """[N, V] bool: the kept set {j : z_j - max z >= tau} of each row of `z [N, V]`, plus `labels [N]` if given."""
    mask = (z - z.amax(-1, keepdim=True)) >= tau[:, None]
    if labels is not None:
        mask = mask.scatter(1, labels[:, None], True)
    return mask


def mask_outside_kept_(z: torch.Tensor, tau: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sets z [N, V] to -inf outside each row's kept set (tau [N]), keeping `labels [N]`, in place; returns z.

    One pass over z for the comparison, no [N, V] temporary besides the boolean mask."""
    label_z = z.gather(1, labels[:, None])
    threshold = z.amax(1, keepdim=True) + tau[:, None].to(z.dtype)
    z.masked_fill_(z < threshold, -math.inf)
    return z.scatter_(1, labels[:, None], label_z)


def kept_log_probs(z: torch.Tensor, labels: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """log pi_K(y) = z_y - logsumexp_{j in K ∪ {y}} z_j for rows z [N, V], labels [N], thresholds tau [N].

    The plain (differentiable) form; `credo.algos.logprobs_from_hidden(..., kept_threshold=tau)` computes the same
    from hidden states in chunks. Returns [N] in z's dtype.
    """
    masked = z.masked_fill(~kept_mask(z.detach(), tau, labels), -math.inf)
    return masked.log_softmax(-1).gather(1, labels[:, None])[:, 0]
