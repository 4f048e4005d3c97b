"""Truncated sampling that records its kept sets: what the hf backend runs under `rollout.kept_set_replay`.

transformers' top-k / top-p / min-p warpers do not say which tokens they kept, and break ties at the top-p boundary
by their sort order. `KeptSetWarper` replaces them (generate then runs with temperature 1 and no warpers of its own):
at each step it scales the logits by 1/T, finds each row's kept set with `credo.algos.kept_set_threshold` in
transformers' order (top-k, top-p, min-p; ties kept), sets the rest to -inf and records the threshold tau [B]. The
draw is transformers' own multinomial over those scores, so the recorded set is exactly the one sampled from, and
the returned scores give mu(y) = p(y) / S over it (docs/truncated_sampling.md).
"""

from __future__ import annotations

import math

import torch

from credo.algos.kept_set import kept_mask, kept_set_threshold


def truncation_settings(top_k: int, top_p: float, min_p: float) -> dict:
    """The keyword form the engines take, checked: top_k >= 0, top_p in (0, 1], min_p in [0, 1)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k is {top_k!r}, expected an int >= 0 (0 = off)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p is {top_p!r}, expected in (0, 1]")
    if not 0 <= min_p < 1:
        raise ValueError(f"min_p is {min_p!r}, expected in [0, 1) (0 = off)")
    return dict(top_k=top_k, top_p=top_p, min_p=min_p)


def truncates(top_k: int, top_p: float, min_p: float) -> bool:
    return top_k > 0 or top_p < 1 or min_p > 0


class KeptSetWarper:
    """A transformers logits processor: temperature, then the kept set of top-k / top-p / min-p, recorded.

    Args:
        temperature: > 0. top_k, top_p, min_p: as `credo.algos.kept_set_threshold`.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float, min_p: float):
        if not temperature > 0:
            raise ValueError(f"temperature is {temperature}, expected > 0")
        self.temperature = temperature
        self.rule = truncation_settings(top_k, top_p, min_p)
        self.thresholds: list[torch.Tensor] = []  # per step: [B] tau of each row's kept set

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """Scaled scores [B, V] float32 with every token outside the kept set at -inf; records tau [B]."""
        z = scores.float() / self.temperature
        tau = kept_set_threshold(z, order="hf", **self.rule)
        self.thresholds.append(tau)
        return z.masked_fill(~kept_mask(z, tau), -math.inf)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.mask(scores)

    def recorded(self, rows: int, steps: int) -> torch.Tensor:
        """The thresholds [rows, steps] float32 of the steps taken (-inf past the recorded ones)."""
        out = torch.full((rows, steps), -math.inf)
        if self.thresholds:
            taus = torch.stack(self.thresholds, 1).cpu()[:, :steps]
            out[:, : taus.shape[1]] = taus
        return out
