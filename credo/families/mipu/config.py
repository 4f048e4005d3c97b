"""The MIPU family's recipe section (`mipu:`) and its load-time checks (arXiv 2606.29526, step 2)."""

from __future__ import annotations

from dataclasses import dataclass

from credo.config import out_of_range, ranged
from credo.errors import ConfigError


@dataclass
class MipuConfig:
    enabled: bool = False
    """MIPU step 2 (arXiv 2606.29526): after each update, validate the synced candidate on held-out training
    prompts and roll the whole trainer state back when T_post < -c_k (docs/mipu.md)."""
    val_prompts: int = ranged(8, ge=1)
    """Held-out training prompts per validation (the last val_prompts problems of the training split, never trained on)."""
    val_group_size: int = ranged(4, ge=2, note="a group needs 2 responses for a group-relative advantage")
    """Responses sampled per validation prompt."""
    c_start: float = 1e-3
    """Tolerance c_k at the first step (accept iff T_post >= -c_k); paper Qwen3-4B: 1e-3."""
    c_end: float = 0.0
    """Tolerance c_k after anneal_steps; paper Qwen3-4B: 0."""
    anneal_steps: int = ranged(100, ge=0)
    """Steps of the linear anneal of c_k from c_start to c_end (paper: 100)."""
    random_rollback: float = ranged(0.0, ge=0, le=1)
    """Control: roll back each step with this probability, no validation (set it to MIPU's measured rate)."""


def check_mipu(r) -> None:
    m = r.mipu
    for key in ("c_start", "c_end"):
        v = getattr(m, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            raise out_of_range(f"mipu.{key}", v, "a finite number")
    if m.enabled and m.random_rollback:
        raise ConfigError(f"config keys 'mipu.enabled' and 'mipu.random_rollback' = {m.random_rollback} are both set: "
                          "expected one (the random-rollback control replaces the validation, it does not add to it)")
    if (m.enabled or m.random_rollback) and r.optim.zero_stage >= 3:
        raise out_of_range("engine.zero_stage", r.optim.zero_stage, "<= 2 with mipu.enabled or mipu.random_rollback "
                           "(a rollback restores the weights in memory; ZeRO-3 partitions them)")
    if m.enabled and m.val_prompts >= r.task.train_size:
        raise out_of_range("mipu.val_prompts", m.val_prompts, f"< task.train_size ({r.task.train_size}): the "
                           "validation prompts are held out of the training split")
    w_max = r.algo.loss_kwargs.get("w_max") if r.algo.policy_loss == "mipu" else None
    if w_max is not None and (isinstance(w_max, bool) or not isinstance(w_max, (int, float)) or not w_max >= 1):
        raise out_of_range("algo.loss_kwargs.w_max", w_max, ">= 1 (the truncation of pi_old / mu; paper: 2)")
