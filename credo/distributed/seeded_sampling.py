"""Per-sample seeded sampling: the tokens drawn for a prompt depend on its own seed only, not on its batch.

`HFBackend(per_sample_seeds=True)` samples with the Gumbel-max trick: the token at response position t of
row b is argmax_v(log p_b,t(v) + G(seed_b, t, v)), where log p is the processed distribution (temperature,
then top-p) and G is standard Gumbel noise computed from (seed, position, vocab id) by an integer hash, with
no RNG state at all. argmax(log p + Gumbel) is an exact draw from p (Gumbel 1954; the "Gumbel-max trick",
e.g. Maddison et al. 2014, arXiv 1411.0030). So splitting a step's prompts over 1, 2 or 4 rollout workers, or
redoing a lost worker's prompts elsewhere, draws the same tokens (up to the logits themselves being equal,
see docs/cluster.md), while the batch stays one vectorised generate call.

The hash is a 32-bit integer mixer (the two-multiply "lowbias32" form, constants below 2^31 so int64
products never overflow), applied in torch on int64 tensors: one mix per (row, vocab id) per step.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer mixer on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def seed_keys(seeds: list[int]) -> torch.Tensor:
    """One 32-bit key [B] (int64) per seed; a seed of any size (negative too) is folded in 32-bit words."""
    lo = torch.tensor([s & MASK32 for s in seeds], dtype=torch.int64)
    hi = torch.tensor([(s >> 32) & MASK32 for s in seeds], dtype=torch.int64)
    return mix32(mix32(lo) ^ hi)


def gumbel_noise(keys: torch.Tensor, position: int | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [B, V] (float32), a pure function of (key b, position, vocab id).

    Args:
        keys: [B] int64 keys from `seed_keys`.
        position: the response position, one for all rows or [B] int64 (rows continuing partial responses).
    """
    pos = torch.as_tensor(position, dtype=torch.int64)
    row = mix32(keys ^ mix32((pos + 0x9E3779B9) & MASK32))  # [B]
    col = mix32(torch.arange(vocab_size, dtype=torch.int64))  # [V]
    h = mix32(row[:, None] ^ col[None, :])  # [B, V], 32 uniform bits each
    u = (h.double() + 0.5) * 2.0**-32  # in (0, 1): never exactly 0 or 1
    return (-torch.log(-torch.log(u))).float()


def nucleus_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logits [B, V]` with every token outside the top-p nucleus set to -inf: keep the most probable tokens
    while the mass of the tokens ranked above them is below top_p (so at least the top token stays)."""
    if top_p >= 1:
        return logits
    sorted_logits, order = logits.sort(-1, descending=True)
    mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class SeededGumbelSampler:
    """A transformers logits processor that makes greedy decoding draw seeded samples (see the module docstring).

    Used with `do_sample=False`: each call returns log p + Gumbel noise, whose argmax is the draw. It keeps the
    processed log-probs [B, V] of the previous step only, and records the drawn token's log-prob when the next
    call shows which token was taken (`finish` records the last one).

    Args:
        seeds: one seed per row of the batch.
        temperature: > 0; top_p: in (0, 1].
        top_k, min_p, record_kept_sets: truncate with `credo.distributed.kept_set_sampling.KeptSetWarper` and keep
            each step's kept-set thresholds (`kept_sets.recorded`).
    """

    def __init__(self, seeds: list[int], temperature: float, top_p: float, *, top_k: int = 0, min_p: float = 0.0,
                 record_kept_sets: bool = False, start_positions: list[int] | None = None):
        if not temperature > 0:
            raise ValueError(f"temperature is {temperature}, expected > 0 for seeded sampling")
        self.keys = seed_keys(seeds)
        self.temperature, self.top_p = temperature, top_p
        # top_k / min_p, or a recorded kept set: the tie-closed sets of credo.algos.kept_set (thresholds in
        # `kept_sets.thresholds`); otherwise the nucleus mask above, as before they existed
        self.kept_sets = None
        if top_k or min_p or record_kept_sets:
            from credo.distributed.kept_set_sampling import KeptSetWarper

            self.kept_sets = KeptSetWarper(temperature, top_k, top_p, min_p)
        self.position = 0
        # per row, the response position of its first token here: a request continued from its partial response
        # draws the noise of the positions it would have reached in one call (credo.distributed.hf_service)
        self.start = None if start_positions is None else torch.tensor(start_positions, dtype=torch.int64)
        self.last_log_probs: torch.Tensor | None = None
        self.token_log_probs: list[torch.Tensor] = []  # per position: [B] log-prob of the drawn token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last_log_probs is not None:  # input_ids now ends with the token drawn from them
            self._record(input_ids[:, -1])
        if self.kept_sets is not None:
            logp = self.kept_sets.mask(scores).log_softmax(-1)
        else:
            logp = nucleus_mask(scores.float() / self.temperature, self.top_p).log_softmax(-1)
        self.last_log_probs = logp
        position = self.position if self.start is None else self.start + self.position
        noise = gumbel_noise(self.keys, position, logp.shape[-1]).to(logp.device)
        self.position += 1
        return logp + noise

    def _record(self, tokens: torch.Tensor) -> None:
        self.token_log_probs.append(self.last_log_probs.gather(-1, tokens[:, None])[:, 0])
        self.last_log_probs = None

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Log-probs [B, T] of the drawn tokens `generated [B, T]` (rows past their EOS hold padding values)."""
        if self.last_log_probs is not None:
            self._record(generated[:, len(self.token_log_probs)])
        if not self.token_log_probs:
            return torch.zeros(generated.shape[0], 0)
        return torch.stack(self.token_log_probs, 1)
