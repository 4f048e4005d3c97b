"""Settings of the `attention_credit` probe (arXiv 2510.13554 preplan-and-anchor, arXiv 2606.10646 FlowTracer)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from credo.config import one_of, ranged
from credo.errors import ConfigError

STRATEGIES = ("local", "global", "coupled", "flow", "random", "entropy")
RHYTHM_KEYS = ("head_quantile", "window", "h_lo", "h_hi", "k", "alpha", "tau_waad", "tau_delta", "block_size",
               "scores_per_step")
FLOW_KEYS = ("edge_threshold", "normalize", "block_size", "scores_per_step")


@dataclass
class AttentionCreditSettings:
    """`stages.probe_kwargs.attention_credit`; a key left null takes the credit function's default."""

    strategy: str = one_of("coupled", STRATEGIES)
    """local, global, coupled (preplan-and-anchor), flow (FlowTracer), random or entropy (the papers' baselines)."""
    layers: Optional[list] = None
    """Decoder layers whose attention is captured; null = the credit function's default sample of layers."""
    q: float = ranged(0.4, gt=0, le=1)
    """Share of the response (or loss) tokens selected for amplification (the papers' top 40%)."""
    gamma_amp: float = ranged(1.5, gt=0)
    """Multiplier of the selected tokens' losses (the papers' 1.5)."""
    sign_mode: str = one_of("both", ("both", "positive", "negative"))
    """Amplify tokens of both advantage signs, or only positive / negative ones."""
    answer_tokens: int = ranged(8, ge=1)
    """flow: the last this many response tokens are the answer (inferred: the batch does not mark it)."""
    seed: Optional[int] = None
    """Seed of the random baseline; null = run.seed."""
    storage_device: Optional[str] = None
    """Where captured query/key states wait (e.g. cpu); null = the model's device."""
    head_quantile: Any = None
    window: Any = None
    h_lo: Any = None
    h_hi: Any = None
    k: Any = None
    alpha: Any = None
    tau_waad: Any = None
    tau_delta: Any = None
    block_size: Any = None
    scores_per_step: Any = None
    edge_threshold: Any = None
    normalize: Any = None

    def credit_kwargs(self) -> dict:
        """The strategy-specific keys that are set (passed on to the credit function)."""
        own = ("strategy", "layers", "q", "gamma_amp", "sign_mode", "answer_tokens", "seed", "storage_device")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in own
                and getattr(self, f.name) is not None}

    def check(self, key: str) -> None:
        allowed = {"local": RHYTHM_KEYS, "global": RHYTHM_KEYS, "coupled": RHYTHM_KEYS, "flow": FLOW_KEYS}
        unknown = sorted(set(self.credit_kwargs()) - set(allowed.get(self.strategy, ())))
        if unknown:
            raise ConfigError(f"config key '{key}' has unknown key(s) {unknown} for strategy {self.strategy!r} "
                              f"(accepted besides strategy, layers, q, gamma_amp, sign_mode, answer_tokens, seed, "
                              f"storage_device: {sorted(allowed.get(self.strategy, ()))})")
