"""Entropy and format monitoring of a (one-sample) run: the `polymath_monitor` step hook.

One-sample RL trains for hundreds of steps on one prompt; the paper watches the responses' entropy and format
through the run (a collapse of either is the failure to look for). After every step the hook logs, from the
step's batch (this rank's samples):

    polymath/format_frac     share of responses in the expected format: the shape of the problem's reference
                             answer (digit and letter runs abstracted, credo.families.polymath.mix.answer_shape)
    polymath/distinct_frac   distinct responses per group / group size, averaged over groups (1 = all differ)
    polymath/sampled_nll     mean -log p of the sampled response tokens under the sampler: an estimate of the
                             per-token entropy at the sampling temperature
    polymath/reward/<d>      mean reward of the step's samples of discipline d (the full-data runs' mix)

The policy's exact mean token entropy over the loss tokens is the core's train/entropy; the response length is
train/response_len. The hook has no state.
"""

from __future__ import annotations

from credo.families.polymath.mix import format_ok


class PolymathMonitor:
    name = "polymath_monitor"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def before_step(self, step: int) -> None:
        pass

    def after_sync(self, step: int, batch) -> dict[str, float]:
        return step_monitors(self.tokenizer.batch_decode([s.response_ids for s in batch.samples],
                                                         skip_special_tokens=True), batch)


def step_monitors(texts: list[str], batch) -> dict[str, float]:
    """The monitors of one batch whose decoded responses are `texts` (see the module docstring)."""
    if not texts:
        return {}
    out = {"polymath/format_frac": sum(format_ok(t, p) for t, p in zip(texts, batch.problems)) / len(texts)}
    groups: dict[int, list[str]] = {}
    for t, g in zip(texts, batch.group_ids.tolist()):
        groups.setdefault(g, []).append(t)
    out["polymath/distinct_frac"] = sum(len(set(ts)) / len(ts) for ts in groups.values()) / len(groups)
    n_tok = sum(len(s.response_ids) for s in batch.samples if s.rollout_log_probs)
    if n_tok:
        total = sum(-sum(s.rollout_log_probs[:len(s.response_ids)]) for s in batch.samples if s.rollout_log_probs)
        out["polymath/sampled_nll"] = total / n_tok
    by_d: dict[str, list[float]] = {}
    for p, r, ok in zip(batch.problems, batch.rewards.tolist(), batch.valid.tolist()):
        d = p.meta.get("discipline") if isinstance(p.meta, dict) else None
        if d is not None and ok:
            by_d.setdefault(d, []).append(r)
    out.update({f"polymath/reward/{d}": sum(v) / len(v) for d, v in sorted(by_d.items())})
    return out
