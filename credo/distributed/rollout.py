"""Rollout backends behind one small interface, and the `Sample` record they return.

A backend turns prompt token ids into `Sample`s carrying the response tokens, the sampler's own
log-probs and a response mask. `response_mask` is separate from the tokens so a multi-turn agent can put
environment/observation tokens in the response with mask 0 (IPA chunks are the runs of 1s);
`policy_version` lets an asynchronous scheduler bound staleness per sample.

    class RolloutBackend(Protocol):
        def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds) -> list[Sample]
        def sync_weights(self, model, version) -> None      # after each optimizer step
        def close(self) -> None

`seeds[i]` seeds prompt i's sampling, so a resumed run draws the same responses as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class Sample:
    prompt_ids: list[int]
    """Prompt token ids."""
    response_ids: list[int]
    """Everything after the prompt: model tokens and (multi-turn) observation tokens."""
    response_mask: list[int]
    """1 on tokens the policy generated (trained on), 0 on observation tokens."""
    rollout_log_probs: list[float]
    """The sampler's log-prob of each response token (0.0 where response_mask is 0)."""
    finished: bool
    """True when the response ended with EOS, False when it hit the length cap."""
    policy_version: int = 0
    """Optimizer step of the weights that generated it."""
    meta: dict = field(default_factory=dict)
    """Free-form: group id, problem index, environment info."""


class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int]) -> list[Sample]: ...

    def sync_weights(self, model: torch.nn.Module, version: int) -> None: ...

    def close(self) -> None: ...


def strip_response(ids: list[int], eos_id: int, pad_id: int) -> tuple[list[int], bool]:
    """Cut a generated sequence after its first EOS (kept) and drop padding; report whether it finished."""
    out = []
    for t in ids:
        out.append(t)
        if t == eos_id:
            return out, True
    while out and out[-1] == pad_id and pad_id != eos_id:
        out.pop()
    return out, False


class HFBackend:
    """transformers `generate` on the trainer's own module: no copy, so weight sync is a no-op.

    Prompts are left-padded and sampled in one call under a forked RNG seeded from `seeds`, so results do
    not depend on the global RNG (vLLM instead seeds each request).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch: int = 256):
        self.model = model
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.max_batch = max_batch
        self.version = 0

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        self.model = model
        self.version = version

    def close(self) -> None:
        pass

    @torch.no_grad()
    def _generate_block(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                        seed: int | None) -> list[Sample]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        greedy = seed is None
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_id, pad_token_id=self.pad_id, output_scores=True, return_dict_in_generate=True,
                **kwargs,
            )
        self.model.train(was_training)
        gen = out.sequences[:, width:]
        # scores are the processed logits the sampler drew from (temperature/top-p applied); one gather
        # picks each generated token's log-prob (a per-token Python lookup cost more than the sampling)
        tok_logp = None
        if out.scores:
            logp = torch.stack(out.scores, 1).float().log_softmax(-1)
            tok_logp = logp.gather(-1, gen[:, : logp.shape[1]].unsqueeze(-1)).squeeze(-1).cpu().tolist()
        gen = gen.cpu().tolist()
        samples = []
        for i, p in enumerate(prompts):
            resp, finished = strip_response(gen[i], self.eos_id, self.pad_id)
            lps = tok_logp[i][: len(resp)] if tok_logp is not None else []
            samples.append(Sample(list(p), resp, [1] * len(resp), lps, finished, self.version))
        return samples

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None) -> list[Sample]:
        """Sample one response per prompt; `seeds=None` decodes greedily."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        # One RNG stream for the whole call, derived from all seeds: the same prompts and seeds give the
        # same samples (what resume needs) while the batch stays one generate call (what speed needs).
        block_seed = None if seeds is None else int.from_bytes(hashlib.sha256(repr(list(seeds)).encode()).digest()[:4], "little")
        samples: list[Sample] = []
        for start in range(0, len(prompts), self.max_batch):
            seed = None if block_seed is None else block_seed + start
            samples += self._generate_block(prompts[start:start + self.max_batch], max_new_tokens, temperature, top_p, seed)
        return samples
