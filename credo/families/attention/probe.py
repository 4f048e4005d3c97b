"""The `attention_credit` probe: per-token loss weights from attention captured during the recompute.

Named in a recipe as

    stages:
      probes: [attention_credit]
      probe_kwargs: {attention_credit: {strategy: coupled}}

(`credo.train.registry.LAZY_BUILTINS` imports this module on first lookup). It rides the no-grad
log-prob recompute of each step (`PolicyScorer.recompute`), or, when the update is one on-policy pass
and there is no recompute, the update's own forward of each micro-batch (`PolicyScorer.update_forward`,
so the probe costs no extra forward): hooks capture the
post-RoPE query/key states of the sampled layers (`credo.credit.capture_qk`), and `result` turns
them into multipliers ``gamma`` that become `batch.weights`. Each token's loss is multiplied by its
``gamma``, which for the policy-gradient losses equals rescaling its advantage, ``A~_t = gamma_t *
A_t`` (arXiv 2510.13554, Eq. 12; ``gamma > 0`` commutes with PPO's clipped minimum).

Strategies:

- ``local``, ``global``, ``coupled``: preplan-and-anchor credit (arXiv 2510.13554).
- ``flow``: FlowTracer throughput (arXiv 2606.10646); the question is the prompt, the answer the
  last ``answer_tokens`` response tokens of each sample (inferred: the batch does not mark the final
  answer's tokens).
- ``random``: a uniformly random ``q`` share of each sample's loss tokens amplified by
  ``gamma_amp`` (the papers' "random credit" baseline, seeded by ``seed``, the step and the rank).
- ``entropy``: the ``q`` share with the highest entropy (the "high-entropy credit" baseline);
  tokens with zero entropy are never selected.

Both baselines use the same TopQ count rule as the attention strategies (`credo.credit.flow_gamma`
selects the top ``q`` share of positive scores). The attention strategies select among the
response tokens, the baselines among the loss tokens (where the recompute has entropies); both are
the same set on every sample that trains.

Metrics (this rank's batch, over loss tokens): ``credit/gamma_mean``, ``credit/gamma_max``,
``credit/amplified_frac`` (share with ``gamma > 1``), and ``perf/credit_s``: host seconds in the capture
hooks plus the reduction to weights (not the recompute forward itself, which is in ``perf/logprob_s``).

Memory: the captured states of the sampled layers, ``L * B * (H + H_kv) * N * head_dim`` values in
the model dtype, on top of the recompute forward (``storage_device: cpu`` keeps them in host memory
and reduces one sequence at a time on the accelerator); the maps are never built (see
docs/credit.md).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import torch

from credo.config import ConfigError
from credo.families.attention.config import AttentionCreditSettings
from credo.train.registry import stage_settings
from credo.credit import capture_qk, flow_gamma, flow_gamma_from_qk, rhythm_gamma_from_qk

if TYPE_CHECKING:
    from credo.train.batch import Batch

STRATEGIES = ("local", "global", "coupled", "flow", "random", "entropy")
_ATTENTION = ("local", "global", "coupled", "flow")


class AttentionCreditProbe:
    """Per-token loss weights from one of :data:`STRATEGIES`; see the module docstring."""

    name = "attention_credit"

    def __init__(self, strategy: str = "coupled", *, layers: list[int] | None = None, q: float = 0.4,
                 gamma_amp: float = 1.5, sign_mode: str = "both", answer_tokens: int = 8, seed: int = 0,
                 storage_device: str | None = None, rank: int = 0, **credit_kwargs):
        key = "stages.probe_kwargs.attention_credit"
        if strategy not in STRATEGIES:
            raise ConfigError(f"config key '{key}.strategy' = {strategy!r}, expected one of {STRATEGIES}")
        if answer_tokens < 1:
            raise ConfigError(f"config key '{key}.answer_tokens' = {answer_tokens}, expected a positive int")
        allowed = {
            "local": ("head_quantile", "window", "h_lo", "h_hi", "k", "alpha", "tau_waad", "tau_delta",
                      "block_size", "scores_per_step"),
            "flow": ("edge_threshold", "normalize", "block_size", "scores_per_step"),
        }
        allowed["global"] = allowed["coupled"] = allowed["local"]
        unknown = sorted(set(credit_kwargs) - set(allowed.get(strategy, ())))
        if unknown:
            raise ConfigError(f"config key '{key}' has unknown key(s) {unknown} for strategy {strategy!r} "
                              f"(accepted besides strategy, layers, q, gamma_amp, sign_mode, answer_tokens, seed, "
                              f"storage_device: "
                              f"{sorted(allowed.get(strategy, ()))})")
        self.strategy, self.layers, self.q, self.gamma_amp = strategy, layers, q, gamma_amp
        self.sign_mode, self.answer_tokens, self.seed, self.rank = sign_mode, answer_tokens, seed, rank
        self.storage_device, self.credit_kwargs = storage_device, credit_kwargs
        self.needs_entropy = strategy == "entropy"  # read by PolicyScorer.recompute
        self.rides_update = True  # without a recompute, ride the update's forward (PolicyScorer.update_forward)
        self._capture = None

    def capture(self, model: torch.nn.Module):
        if self.strategy not in _ATTENTION:
            return contextlib.nullcontext()
        return self._hooks(model)

    @contextlib.contextmanager
    def _hooks(self, model):
        self._capture = None
        with capture_qk(model, self.layers, storage_device=self.storage_device) as cap:
            yield
        self._capture = cap

    def result(self, batch: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """``{"weights": [B, T]}``: column j weighs the loss of token j+1 (``gamma`` of that token)."""
        start = time.perf_counter()
        hook_s = self._capture.hook_s if self._capture is not None else 0.0
        if self.strategy in _ATTENTION:
            weights = self._attention_weights(batch)
        else:
            weights = self._baseline_weights(batch, entropy)
        batch.metrics["perf/credit_s"] = hook_s + time.perf_counter() - start
        weights = weights.to(log_probs.device, torch.float32)
        on = batch.loss_mask
        chosen = weights[on]
        batch.metrics["credit/gamma_mean"] = float(chosen.mean()) if chosen.numel() else 1.0
        batch.metrics["credit/gamma_max"] = float(chosen.max()) if chosen.numel() else 1.0
        batch.metrics["credit/amplified_frac"] = float((chosen > 1).float().mean()) if chosen.numel() else 0.0
        return {"weights": weights}

    def _attention_weights(self, batch: Batch) -> torch.Tensor:
        cap, self._capture = self._capture, None
        if cap is None:
            raise RuntimeError("attention_credit: result() called without a captured forward (capture() not entered)")
        attention_mask = batch.attention_mask
        # Token-aligned [B, L] masks from the label-aligned [B, T] ones: column j is token j+1.
        response = torch.zeros(attention_mask.shape, dtype=torch.bool, device=attention_mask.device)
        response[:, 1:] = batch.response_mask.bool()
        advantages = None
        if self.sign_mode != "both":
            advantages = torch.zeros(attention_mask.shape, dtype=torch.float32, device=attention_mask.device)
            advantages[:, 1:] = batch.advantages
        if self.strategy == "flow":
            gamma = flow_gamma_from_qk(cap, attention_mask, response, _last_tokens(response, self.answer_tokens),
                                       advantages=advantages, q=self.q, gamma_flow=self.gamma_amp,
                                       sign_mode=self.sign_mode, **self.credit_kwargs)
        else:
            gamma = rhythm_gamma_from_qk(cap, attention_mask, response, strategy=self.strategy, advantages=advantages,
                                         q=self.q, gamma_amp=self.gamma_amp, sign_mode=self.sign_mode,
                                         **self.credit_kwargs)
        return gamma[:, 1:]

    def _baseline_weights(self, batch: Batch, entropy: torch.Tensor | None) -> torch.Tensor:
        mask = batch.loss_mask.bool()
        if self.strategy == "entropy":
            if entropy is None:
                raise RuntimeError("attention_credit: strategy 'entropy' needs the recompute's entropy, got None")
            scores = entropy.float()
        else:
            g = torch.Generator().manual_seed(_mix(self.seed, batch.step, self.rank))
            # Draw for the whole batch and take this view's rows, so a micro-batch split draws the same tokens.
            rows = getattr(batch, "source_rows", None)
            size = getattr(batch, "source_size", mask.shape[0])
            scores = torch.rand((size, mask.shape[1]), generator=g).add_(1e-6)  # > 0: all selectable
            scores = (scores if rows is None else scores[rows.cpu()]).to(mask.device)
        return flow_gamma(scores, response_mask=mask, advantages=batch.advantages, q=self.q, gamma_flow=self.gamma_amp,
                          sign_mode=self.sign_mode)


def _last_tokens(response: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, L]`` bool: the last ``count`` response tokens of each row."""
    from_end = response.flip(-1).long().cumsum(-1).flip(-1)  # response tokens at or after each column
    return response & (from_end <= count)


def _mix(*parts: int) -> int:
    """A generator seed from several ints (distinct steps and ranks draw different tokens)."""
    value = 0
    for part in parts:
        value = (value * 1_000_003 + int(part)) % (2**63 - 1)
    return value


def make_attention_credit_probe(ctx, s: AttentionCreditSettings | None = None, **kwargs) -> AttentionCreditProbe:
    """`stages.probes: [attention_credit]`; `stages.probe_kwargs.attention_credit` are `AttentionCreditSettings` (or
    the same as keywords)."""
    s = stage_settings(AttentionCreditSettings, s, kwargs, "stages.probe_kwargs.attention_credit")
    return AttentionCreditProbe(s.strategy, layers=s.layers, q=s.q, gamma_amp=s.gamma_amp, sign_mode=s.sign_mode,
                                answer_tokens=s.answer_tokens, seed=ctx.seed if s.seed is None else s.seed,
                                storage_device=s.storage_device, rank=ctx.rank, **s.credit_kwargs())
