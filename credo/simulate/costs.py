"""The cost model: seconds per decode step, prefill, training, reward and weight sync.

A decode step of a batch of `b` sequences whose contexts hold `ctx` tokens in all costs

    step(b, ctx) = decode_step_s + decode_seq_s * b + decode_ctx_s * ctx

so one step of b sequences costs more than one of a single sequence and, with decode_step_s > 0, less than b
of them (decoding is bound by reading the weights once per step; each sequence adds its own compute and its
KV-cache reads). Over k steps the batch and its growth are fixed (every sequence adds a token per step), so the
time of a chunk of k steps is a closed form and the simulator can jump from one event to the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass
class Costs:
    decode_step_s: float = 0.0
    """Fixed seconds of one decode step of a batch (weights read, kernel launches)."""
    decode_seq_s: float = 0.0
    """Seconds one more sequence adds to a decode step."""
    decode_ctx_s: float = 0.0
    """Seconds one context token (prompt or generated, per sequence) adds to a decode step (attention, KV reads)."""
    prefill_s: float = 0.0
    """Fixed seconds of one prefill (a batch of admitted requests)."""
    prefill_token_s: float = 0.0
    """Seconds per prefilled prompt token."""
    train_fixed_s: float = 0.0
    """Fixed seconds of one training step (optimizer step, launch)."""
    train_token_s: float = 0.0
    """Device-seconds per trained token (recompute of old log-probs + forward + backward), over all train devices."""
    logprob_token_s: float = 0.0
    """Device-seconds per trained token of the trainer's recompute of pi_old (one forward pass), charged in a mode
    whose `old_log_probs` is `recompute`; 0 where train_token_s already holds it (the papers' scenarios)."""
    reward_sample_s: float = 0.0
    """Seconds to score one sample, on one reward worker."""
    reward_workers: int = 1
    """Samples scored in parallel."""
    sync_s: float = 0.0
    """Seconds to push new weights to the rollout engines (0 for a colocated engine sharing the module)."""
    step_overhead_s: float = 0.0
    """Per-step host overhead outside the timed stages (bookkeeping, packing)."""

    @classmethod
    def from_dict(cls, d: dict, where: str = "costs") -> "Costs":
        known = {f.name for f in fields(cls)}
        for k, v in d.items():
            if k not in known:
                raise ValueError(f"{where}.{k} is not a cost key (known: {', '.join(sorted(known))})")
            if not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v):
                raise ValueError(f"{where}.{k} = {v!r}: expected a finite number >= 0")
        c = cls(**d)
        if c.reward_workers < 1:
            raise ValueError(f"{where}.reward_workers = {c.reward_workers}: expected >= 1")
        return c


def chunk_time(c: Costs, b: int, ctx: float, k: int) -> float:
    """Seconds of k decode steps of b sequences whose contexts start at ctx tokens in all (each step adds b)."""
    per = c.decode_step_s + c.decode_seq_s * b + c.decode_ctx_s * ctx
    return k * per + c.decode_ctx_s * b * k * (k - 1) / 2


def steps_done(c: Costs, b: int, ctx: float, elapsed: float, k_max: int) -> int:
    """Whole decode steps finished after `elapsed` seconds of a chunk (the inverse of chunk_time), at most k_max."""
    per = c.decode_step_s + c.decode_seq_s * b + c.decode_ctx_s * ctx
    g = c.decode_ctx_s * b / 2  # chunk_time(k) = g k^2 + (per - g) k
    if g <= 0:
        k = math.floor(elapsed / per + 1e-9) if per > 0 else k_max
    else:
        lin = per - g
        k = math.floor((-lin + math.sqrt(lin * lin + 4 * g * elapsed)) / (2 * g) + 1e-9)
    return max(0, min(k_max, k))


def prefill_time(c: Costs, tokens: int) -> float:
    """Seconds to prefill `tokens` prompt tokens in one batch."""
    return c.prefill_s + c.prefill_token_s * tokens


def train_time(c: Costs, tokens: int, devices: int) -> float:
    """Seconds of one training step over `tokens` tokens spread over `devices` train devices."""
    return c.train_fixed_s + c.train_token_s * tokens / max(1, devices)


def reward_time(c: Costs, samples: int) -> float:
    """Seconds to score `samples` samples on the reward workers (a batch stage)."""
    return c.reward_sample_s * math.ceil(samples / c.reward_workers)
