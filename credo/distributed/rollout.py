"""Rollout backends behind one small interface, and the `Sample` record they return.

A backend turns prompt token ids into `Sample`s carrying the response tokens, the sampler's own
log-probs and a response mask. `response_mask` is separate from the tokens so a multi-turn agent can put
environment/observation tokens in the response with mask 0 (IPA chunks are the runs of 1s);
`policy_version` lets an asynchronous scheduler bound staleness per sample.

    class RolloutBackend(Protocol):
        def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds,
                     prefix_embeds=None) -> list[Sample]
        def sync_weights(self, model, version) -> None      # after each optimizer step
        def close(self) -> None
        # optional, for tail batching (credo.distributed.race): sample until enough groups are complete
        def generate_race(self, prompts, groups, *, need, groups_needed, max_new_tokens, ...) -> RaceResult

`seeds[i]` seeds prompt i's sampling, so a resumed run draws the same responses as an uninterrupted one.
`prefix_embeds` ([N, k, d], optional) are soft-prompt embeddings the model reads before prompt i's own token
embeddings (a source that conditions the policy on a sampled latent); the trainer's forwards see the same rows through
`Batch.prefix_embeds`. Without them nothing changes.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import torch

from credo.capabilities import BACKENDS
from credo.distributed.kept_set_sampling import KeptSetWarper, truncates, truncation_settings
from credo.distributed.seeded_sampling import SeededGumbelSampler
from credo.moe import ROUTER_CLASSES, RoutingRecorder, routers, sample_routing


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
    """The trainer step whose weights generated it: the `version` of the last `sync_weights` (0 = the initial
    weights). It counts steps, not applied optimizer updates: a skipped step still advances it."""
    meta: dict = field(default_factory=dict)
    """Free-form: group id, problem index, environment info."""
    kept_thresholds: list[float] | None = None
    """With kept-set recording (`generate(..., kept_set=True)` under top-k/top-p/min-p): per response token, the
    threshold tau of the set the sampler drew from, K = {j : z_j - max z >= tau} over the scaled logits z
    (`credo.algos.kept_set`; -inf = nothing cut); None otherwise."""
    policy_versions: list[int] | None = None
    """Partial rollout (`credo.distributed.partial`): per response token, the version of the weights that sampled
    it (`policy_version` is then the oldest); None: every token has `policy_version`."""
    routed_experts: torch.Tensor | None = None
    """With routing capture (`generate(..., routing=True)` on an MoE model): [P + R - 1, n_layers, k] int16, the experts
    each MoE layer routed input position j of prompt + response to (every response token but the last, which no
    forward read; `credo.moe`); None otherwise."""


class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int]) -> list[Sample]: ...

    def sync_weights(self, model: torch.nn.Module, version: int) -> None: ...

    def close(self) -> None: ...


def response_lengths(gen: torch.Tensor, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lengths [B] and finished flags [B] of generated rows `gen [B, T]`.

    A row keeps everything up to and including its first EOS (finished); a row without EOS drops its
    trailing padding (truncated at the length cap).
    """
    T = gen.shape[1]
    is_eos = gen == eos_id
    finished = is_eos.any(1)
    first_eos = torch.where(finished, is_eos.int().argmax(1), T)
    pos = torch.arange(T, device=gen.device)[None, :]
    keep = pos <= first_eos[:, None]
    if pad_id != eos_id:
        not_pad = (gen != pad_id) & keep
        last_real = torch.where(not_pad.any(1), T - 1 - not_pad.flip(1).int().argmax(1), -1)
        keep &= finished[:, None] | (pos <= last_real[:, None])
    return keep.sum(1), finished


class HFBackend:
    """transformers `generate` on the trainer's own module: no copy, so weight sync is a no-op (with `dtype` or
    `fp8_weights`: on a lower-precision copy, re-synced by `sync_weights`).

    Prompts are left-padded and sampled in one call (or blocks of `max_batch` prompts, 0 = one call)
    under a forked RNG seeded from `seeds`, so results do not depend on the global RNG (vLLM instead
    seeds each request). Padding, the EOS cut and the sampler log-probs are tensor operations: with a
    small model, per-sample Python work after `generate()` cost as much as a quarter of the sampling.

    `per_sample_seeds=True` instead draws each prompt's tokens from its own seed (Gumbel-max with counter-based
    noise, credo.distributed.seeded_sampling), so a prompt's tokens do not depend on which other prompts share
    its call: what a rollout spread over several workers needs. Off by default (today's runs stay bit-identical).
    """

    provides = BACKENDS["hf"]
    """What this backend provides (`credo.capabilities.BACKENDS`, checked by the run plan)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch: int = 0, dtype: str | None = None,
                 fp8_weights: bool = False, per_sample_seeds: bool = False):
        if max_batch < 0:
            raise ValueError(f"max_batch must be >= 0 (0 = all prompts in one generate call), got {max_batch}")
        # with a dtype or FP8 weights the sampler is a copy of the policy at that precision (an induced
        # train/inference mismatch, see credo.distributed.rollout_copy); otherwise the trainer's module itself
        self.copy = None
        if dtype is not None or fp8_weights:
            from credo.distributed.rollout_copy import RolloutCopy

            self.copy = RolloutCopy(model, dtype=dtype, fp8_weights=fp8_weights)
        self.model = model if self.copy is None else self.copy.module
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.max_batch = max_batch
        self.per_sample_seeds = per_sample_seeds
        self.version = 0
        self._gen_configs: dict = {}

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if self.copy is None:
            self.model = model
        else:
            self.copy.sync_from(model)
        self.version = version

    def close(self) -> None:
        pass

    def _generation_config(self, max_new_tokens: int, temperature: float, top_p: float, mode: str, top_k: int = 0,
                           min_p: float = 0.0):
        # Built once per setting: passing kwargs makes transformers copy and re-validate the model's
        # generation config on every call. mode 'seeded' decodes greedily over Gumbel-perturbed scores; mode 'kept'
        # samples with no warpers of transformers' own (KeptSetWarper truncates and records).
        key = (max_new_tokens, temperature, top_p, mode, top_k, min_p)
        if key not in self._gen_configs:
            from transformers import GenerationConfig

            sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k) if mode == "sample" \
                else dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if mode == "kept" \
                else dict(do_sample=False)
            if mode == "sample" and min_p:
                sampling["min_p"] = min_p
            self._gen_configs[key] = GenerationConfig(
                max_new_tokens=max_new_tokens, eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                output_scores=mode != "seeded", return_dict_in_generate=True, disable_compile=True, **sampling)
        return self._gen_configs[key]

    @torch.no_grad()
    def _generate_block(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                        seed: int | None, sample_seeds: list[int] | None = None,
                        prefix_embeds: torch.Tensor | None = None, top_k: int = 0, min_p: float = 0.0,
                        kept_set: bool = False, first_positions: list[int] | None = None,
                        stop_when=None, routing: bool = False) -> list[Sample]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device="cpu")
        attn = (torch.arange(width, device="cpu")[None, :]
                >= torch.tensor([width - len(p) for p in prompts], device="cpu")[:, None]).long()
        mode = "seeded" if sample_seeds is not None else "greedy" if seed is None else "sample"
        record = kept_set and mode != "greedy" and truncates(top_k, top_p, min_p)
        if mode == "sample" and record:
            mode = "kept"
        config = self._generation_config(max_new_tokens, temperature, top_p, mode, top_k, min_p)
        sampler = processors = warper = None
        if sample_seeds is not None:
            from transformers import LogitsProcessorList

            sampler = SeededGumbelSampler(sample_seeds, temperature, top_p, top_k=top_k, min_p=min_p,
                                          record_kept_sets=record, start_positions=first_positions)
            processors, warper = LogitsProcessorList([sampler]), sampler.kept_sets
        elif mode == "kept":
            from transformers import LogitsProcessorList

            warper = KeptSetWarper(temperature, top_k, top_p, min_p)
            processors = LogitsProcessorList([warper])
        inputs = dict(input_ids=ids.to(device), attention_mask=attn.to(device))
        if prefix_embeds is not None:
            inputs = prefixed_inputs(self.model, ids.to(device), attn.to(device), prefix_embeds.to(device))
        was_training = self.model.training
        self.model.eval()
        # Only a sampling call draws from (and so forks) the global RNG: greedy and per-sample-seeded calls draw
        # nothing, and must not save and restore it, as a sampler in another thread (the Complementary RL
        # extractor beside the trainer) would rewind the trainer's own stream in between
        recorder = RoutingRecorder(self.model) if routing else contextlib.nullcontext()
        with torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext(), recorder:
            if seed is not None:
                torch.manual_seed(seed)
            stopping = None if stop_when is None else _interrupt_criteria(stop_when)
            out = self.model.generate(**inputs, generation_config=config, logits_processor=processors,
                                      stopping_criteria=stopping)
        self.model.train(was_training)
        # from embeddings alone, transformers returns only the new tokens
        gen = out.sequences[:, width:] if prefix_embeds is None else out.sequences
        # scores are the processed logits the sampler drew from (temperature/top-p applied); taken step by
        # step on the device, so neither a [B, T, V] log-softmax nor a copy of the scores to the CPU is made
        if sampler is not None:
            tok_logp = sampler.finish(gen).cpu().tolist()
        elif out.scores:
            tok_logp = torch.stack([s.float().log_softmax(-1).gather(-1, tok[:, None])[:, 0]
                                    for s, tok in zip(out.scores, gen.unbind(1))], 1).cpu().tolist()
        else:
            tok_logp = [[] for _ in prompts]
        gen = gen.cpu()
        lengths, finished = response_lengths(gen, self.eos_id, self.pad_id)
        lengths = lengths.tolist()
        gen_rows, done = gen.tolist(), finished.tolist()
        samples = [Sample(list(p), gen_rows[i][:n], [1] * n, tok_logp[i][:n], done[i], self.version)
                   for i, (p, n) in enumerate(zip(prompts, lengths))]
        if record:
            taus = warper.recorded(len(prompts), gen.shape[1]).tolist()
            for s, row, n in zip(samples, taus, lengths):
                s.kept_thresholds = row[:n]
        if routing:
            per_position = recorder.per_position(len(prompts))
            if per_position.shape[1] < width + max(lengths) - 1:
                raise RuntimeError(f"routing capture saw {per_position.shape[1]} positions, expected at least "
                                   f"{width + max(lengths) - 1} (a prefill of {width} and a step per later token)")
            records = sample_routing(per_position, [width - len(p) for p in prompts], [len(p) for p in prompts], lengths)
            for s, rec in zip(samples, records):
                s.routed_experts = rec
        return samples

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None, prefix_embeds: torch.Tensor | None = None, top_k: int = 0,
                 min_p: float = 0.0, kept_set: bool = False, first_positions: list[int] | None = None,
                 stop_when=None, routing: bool = False) -> list[Sample]:
        """Sample one response per prompt; `seeds=None` decodes greedily. `prefix_embeds` [N, k, d]: soft-prompt
        embeddings read before each (left-padded) prompt's token embeddings (see the module docstring).

        `first_positions` (per-sample seeds only): per prompt, the response position its first new token takes, for a
        prompt that is a request's prompt + partial response (`credo.distributed.hf_service`); None = 0 for all.

        `top_k` / `min_p` truncate as transformers' warpers do (0 = off). `kept_set=True` with a truncation samples
        through `KeptSetWarper` instead and fills each `Sample.kept_thresholds` (the tie-closed set drawn from).

        `stop_when` (a no-argument callable, per-sample seeds only): asked after every decoded token; when it returns
        True every row stops there, keeping its tokens so far (unfinished rows: `finished` False, shorter than the
        cap). Partial rollout interrupts a request this way when new weights arrive (`credo.distributed.partial`).


        `routing=True` (an MoE model) records the experts every MoE layer chose for each prompt and response position
        into `Sample.routed_experts` (forward hooks on the routers, `credo.moe`); not with `prefix_embeds`."""
        truncation_settings(top_k, top_p, min_p)
        if routing and prefix_embeds is not None:
            raise ValueError("routing capture does not take prefix_embeds (soft-prefix positions have no token)")
        if routing and not routers(self.model):
            raise ValueError("routing=True needs an MoE model (transformers sparse MoE routers: "
                             f"{', '.join(ROUTER_CLASSES)}); this model has none")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        check_prefix_embeds(prefix_embeds, len(prompts), self.model)
        if first_positions is not None and not (self.per_sample_seeds and seeds is not None
                                                and len(first_positions) == len(prompts)):
            raise ValueError("first_positions needs per_sample_seeds=True, seeds, and one position per prompt")
        if stop_when is not None and not (self.per_sample_seeds and seeds is not None):
            # an interrupted block continues from its partial response: only per-sample seeds draw the same tokens
            raise ValueError("stop_when needs per_sample_seeds=True and seeds")
        if not prompts:
            return []
        # One RNG stream for the whole call, derived from all seeds: the same prompts and seeds give the
        # same samples (what resume needs) while the batch stays one generate call (what speed needs).
        block_seed = None if seeds is None else seeds_digest(seeds)
        block = self.max_batch or len(prompts)
        samples: list[Sample] = []
        for start in range(0, len(prompts), block):
            rows = None if prefix_embeds is None else prefix_embeds[start:start + block]
            if self.per_sample_seeds and seeds is not None:  # no RNG stream: each row's noise comes from its seed
                samples += self._generate_block(prompts[start:start + block], max_new_tokens, temperature, top_p, None,
                                                sample_seeds=list(seeds[start:start + block]), prefix_embeds=rows,
                                                top_k=top_k, min_p=min_p, kept_set=kept_set,
                                                first_positions=None if first_positions is None
                                                else list(first_positions[start:start + block]),
                                                stop_when=stop_when, routing=routing)
                continue
            seed = None if block_seed is None else block_seed + start
            samples += self._generate_block(prompts[start:start + block], max_new_tokens, temperature, top_p, seed,
                                            prefix_embeds=rows, top_k=top_k, min_p=min_p, kept_set=kept_set,
                                            routing=routing)
        return samples

    def generate_race(self, prompts: list[list[int]], groups: list[int], *, need: int, groups_needed: int,
                      max_new_tokens: int, temperature: float, top_p: float, seeds: list[int] | None,
                      chunk_tokens: int = 8):
        """Tail batching's short round: sample `prompts` until `groups_needed` groups have `need` finished
        responses (`credo.distributed.race`). Generates `chunk_tokens` tokens per call, carrying the KV cache
        over; between calls finished rows and the rows of complete groups leave the batch. All requests run in
        one batch (`max_batch` does not apply). One RNG stream derived from all seeds; `seeds=None` is greedy."""
        from credo.distributed.race import hf_race

        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        if len(groups) != len(prompts):
            raise ValueError(f"groups has length {len(groups)}, expected {len(prompts)} like prompts")
        return hf_race(self, prompts, groups, need=need, groups_needed=groups_needed, max_new_tokens=max_new_tokens,
                       temperature=temperature, top_p=top_p, seed=None if seeds is None else seeds_digest(seeds),
                       chunk_tokens=chunk_tokens)


def _interrupt_criteria(stop_when):
    """A transformers stopping criterion that stops every row once `stop_when()` is True (asked once per token)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Interrupt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(stop_when()), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Interrupt()])


def seeds_digest(seeds: list[int]) -> int:
    """A 32-bit seed for one RNG stream that samples a whole batch, a function of all its requests' seeds."""
    return int.from_bytes(hashlib.sha256(repr(list(seeds)).encode()).digest()[:4], "little")

def check_prefix_embeds(prefix_embeds: torch.Tensor | None, n: int, model: torch.nn.Module) -> None:
    """`prefix_embeds` is None or [n, k, d] with d the model's embedding width; a ValueError naming it otherwise."""
    if prefix_embeds is None:
        return
    d = model.get_input_embeddings().embedding_dim
    if prefix_embeds.dim() != 3 or prefix_embeds.shape[0] != n or prefix_embeds.shape[2] != d:
        raise ValueError(f"prefix_embeds has shape {list(prefix_embeds.shape)}, expected [{n}, k, {d}] "
                         "(one row of k embeddings per prompt, the model's embedding width)")


def prefixed_inputs(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, prefix: torch.Tensor) -> dict:
    """`inputs_embeds` [B, L + k, d] and `attention_mask` [B, L + k] of left-padded prompts `ids` [B, L] with soft
    prefixes `prefix` [B, k, d] placed right before each prompt's first real token: the padding stays in front, so
    the positions (taken from the attention mask) of prefix and prompt do not depend on it. The prefix is cast to
    the embedding's dtype."""
    tokens = model.get_input_embeddings()(ids)
    B, L = ids.shape
    k, d = prefix.shape[1], tokens.shape[-1]
    pads = (attn == 0).sum(1, keepdim=True)  # [B, 1] left padding per row
    pos = torch.arange(L + k, device=ids.device)[None, :].expand(B, -1)
    # row b: pads_b padding slots, then k prefix slots, then the prompt's L - pads_b tokens
    in_prefix = (pos >= pads) & (pos < pads + k)
    token_src = torch.where(pos < pads, pos, (pos - k).clamp(min=0))
    prefix_src = (pos - pads).clamp(0, k - 1)
    out = torch.where(in_prefix[..., None], prefix.to(tokens.dtype).gather(1, prefix_src[..., None].expand(-1, -1, d)),
                      tokens.gather(1, token_src[..., None].expand(-1, -1, d)))
    return dict(inputs_embeds=out, attention_mask=(pos >= pads).to(attn.dtype))

