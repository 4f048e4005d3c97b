"""`algo.old_log_probs: rollout` at plan time: the combinations it refuses and the warnings `credo check` prints.

With `rollout` the sampler's log-probs mu stand in for pi_old and the recompute forward is skipped (verl's bypass
mode; docs/old_log_probs.md). That is exact only when the sampler computes the trainer's numbers: same weights, same
dtype, same kernels, same (untruncated or replayed) distribution. Where they can differ the plan warns, and the
`mismatch/*` metrics measure the gap. Where pi_old = mu makes a part of the loss a no-op the plan refuses, naming both
keys: a correction by pi_old / mu (TIS, MIS, decoupled PPO) or a loss that compares pi_old with mu itself (IPA's chunk
filter, MIPU's weights) would see a ratio of 1 on every token.

Imports nothing heavy (the plan runs it in `credo check`).
"""

from __future__ import annotations

import inspect

from credo.errors import ConfigError

ROLLOUT = "rollout"


def _refuse(other: str, reason: str) -> ConfigError:
    return ConfigError(f"config keys 'algo.old_log_probs' and '{other}' cannot be used together: {reason}")


def check_old_log_probs(r) -> list[str]:
    """Refuse what `algo.old_log_probs: rollout` cannot run with; return its warnings (each 'warning: ...').

    Raises:
        ConfigError: naming 'algo.old_log_probs' and the key that does not combine with it.
    """
    a = r.algo
    if a.old_log_probs != ROLLOUT:
        return []
    correction = a.loss_kwargs.get("correction")
    if correction is not None:
        raise _refuse("algo.loss_kwargs.correction", f"with 'rollout' pi_old is the sampler's mu, so the '{correction}' "
                      "weight pi_old / mu is 1 on every token and corrects nothing; drop the correction (the ratio is "
                      "already against mu) or use algo.old_log_probs: recompute")
    from credo import algos

    if "rollout_log_probs" in inspect.signature(algos.POLICY_LOSSES[a.policy_loss]).parameters:
        raise _refuse("algo.policy_loss", f"'{a.policy_loss}' compares pi_old with the sampler's mu itself (IPA's chunk "
                      "filter, MIPU's weights); with 'rollout' they are the same tensor and it would compare nothing; "
                      "use algo.old_log_probs: recompute")
    return sampler_differs_warnings(r)


def sampler_differs_warnings(r) -> list[str]:
    """One warning per recipe setting under which the sampler's log-probs are not the trainer's pi_old."""
    ro, why = r.rollout, []
    if ro.dtype is not None and ro.dtype != r.model.dtype:
        why.append(f"rollout.dtype '{ro.dtype}' differs from model.dtype '{r.model.dtype}'")
    if ro.fp8_weights:
        why.append("rollout.fp8_weights samples with FP8-rounded weights")
    if ro.backend == "vllm":
        why.append("rollout.backend 'vllm' runs its own kernels (attention, matmul order, sampler)")
    truncates = ro.top_p < 1 or ro.top_k > 0 or ro.min_p > 0
    if truncates and not ro.kept_set_replay:
        why.append("top_p/top_k/min_p truncate the sampler's distribution and rollout.kept_set_replay is off, so mu "
                   "is log p - log(kept mass) while the trainer scores the full vocabulary")
    return [f"warning: algo.old_log_probs 'rollout' with {w}: the sampler's log-probs are not the trainer's pi_old, so "
            "the ratio starts off 1 by the train/inference mismatch (mismatch/* shows by how much; "
            "docs/old_log_probs.md)" for w in why]
