"""A rollout race: sample until enough groups have enough finished responses, then stop (tail batching's short round).

RollPacker (arXiv 2509.21009) launches more prompts and more responses per prompt than a step trains on. A group
(a prompt's responses) is complete once `need` of its responses have finished; the race ends as soon as
`groups_needed` groups are complete, and every request still running is aborted. A response has finished when it
ends, with EOS or at the length cap.

Completion is decided on decode steps, not on when an engine happens to report: a group completes at the step its
`need`-th response finishes, and the race's winners are the `groups_needed` groups that completed first (ties: the
lower group index). An engine that checks only every few steps (the hf backend's chunks) therefore picks the same
winners as one that checks every step; it only decodes a few steps past the end.

    race_winners(finish_steps, groups, need=, groups_needed=)   -> the winners and their kept responses, or None
    hf_race(model, prompts, groups, ...)                        -> RaceResult, with transformers' generate in chunks
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RaceResult:
    """What a race decoded, per request (prompts in the order given)."""

    samples: list
    """A `Sample` per request that finished before the race stopped, else None (aborted while running)."""
    finish_steps: list
    """The decode step (0-based) at which each request finished, None where it did not."""
    decoded_tokens: int
    """Tokens decoded in all, the aborted requests' partial responses included: the race's cost."""


def race_winners(finish_steps: list, groups: list[int], *, need: int, groups_needed: int
                 ) -> list[tuple[int, list[int]]] | None:
    """The race's winning groups in completion order, each with its first `need` finished requests; None while
    fewer than `groups_needed` groups are complete.

    Args:
        finish_steps: per request, the decode step it finished at, or None (still running, or aborted).
        groups: per request, its group (prompt) index.
    Returns:
        [(group, [request indices])] of length `groups_needed`: a group's requests ordered by (finish step, index).
    """
    done: dict[int, list[tuple[int, int]]] = {}
    for j, (step, g) in enumerate(zip(finish_steps, groups)):
        if step is not None:
            done.setdefault(g, []).append((step, j))
    complete = []
    for g, finished in done.items():
        if len(finished) >= need:
            finished.sort()
            complete.append((finished[need - 1][0], g, [j for _, j in finished[:need]]))
    if len(complete) < groups_needed:
        return None
    complete.sort()
    return [(g, kept) for _, g, kept in complete[:groups_needed]]


def complete_groups(finish_steps: list, groups: list[int], need: int) -> set[int]:
    """Groups with at least `need` finished requests (their other requests are no longer needed)."""
    counts: dict[int, int] = {}
    for step, g in zip(finish_steps, groups):
        if step is not None:
            counts[g] = counts.get(g, 0) + 1
    return {g for g, n in counts.items() if n >= need}


@torch.no_grad()
def hf_race(backend, prompts: list[list[int]], groups: list[int], *, need: int, groups_needed: int,
            max_new_tokens: int, temperature: float, top_p: float, seed: int | None, chunk_tokens: int) -> RaceResult:
    """A race on transformers `generate`, `chunk_tokens` new tokens per call with the KV cache carried over.

    After each call, finished rows leave the batch, and so do the rows of complete groups (their extra responses
    are aborted); the race stops once the winners are known. `backend` is an `HFBackend` (its module, EOS and pad
    ids, generation configs). One forked RNG stream seeded by `seed` runs the whole race (None: greedy).
    """
    from credo.distributed.rollout import Sample

    model = backend.model
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[backend.pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long).to(device)
    attn = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long().to(device)
    race = _Race(len(prompts))
    rows = list(range(len(prompts)))  # the request each row of the live batch decodes
    cache, step = None, 0
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            while rows and step < max_new_tokens:
                config = backend._generation_config(min(chunk_tokens, max_new_tokens - step), temperature, top_p,
                                                    "greedy" if seed is None else "sample")
                out = model.generate(input_ids=ids, attention_mask=attn, past_key_values=cache,
                                     generation_config=config)
                got = race.take_chunk(out, ids.shape[1], rows, step, max_new_tokens, backend.eos_id, backend.pad_id)
                step += got
                if race_winners(race.finish, groups, need=need, groups_needed=groups_needed) is not None:
                    break
                complete = complete_groups(race.finish, groups, need)
                keep = [r for r, j in enumerate(rows) if race.finish[j] is None and groups[j] not in complete]
                if not keep:
                    break
                index = torch.tensor(keep, device=device)
                cache = out.past_key_values
                cache.batch_select_indices(index)
                ids = out.sequences[index]
                attn = torch.cat([attn[index], attn.new_ones(len(keep), got)], 1)
                rows = [rows[r] for r in keep]
    finally:
        model.train(was_training)
    samples = [Sample(list(p), race.tokens[j], [1] * len(race.tokens[j]), race.logps[j], race.eos[j], backend.version)
               if race.finish[j] is not None else None for j, p in enumerate(prompts)]
    return RaceResult(samples, race.finish, race.decoded)


class _Race:
    """Per request: its tokens and sampler log-probs so far, the step it finished at, whether by EOS."""

    def __init__(self, n: int):
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logps: list[list[float]] = [[] for _ in range(n)]
        self.finish: list = [None] * n
        self.eos = [False] * n
        self.decoded = 0

    def take_chunk(self, out, width: int, rows: list[int], step: int, max_new_tokens: int, eos_id: int,
                   pad_id: int) -> int:
        """Append a generate() call's tokens to the requests of `rows`; returns the steps it decoded."""
        from credo.distributed.rollout import response_lengths

        gen = out.sequences[:, width:]
        # the processed scores the sampler drew from, per step (see HFBackend._generate_block)
        lp = torch.stack([s.float().log_softmax(-1).gather(-1, t[:, None])[:, 0]
                          for s, t in zip(out.scores, gen.unbind(1))], 1).cpu().tolist()
        lengths, ended = response_lengths(gen.cpu(), eos_id, pad_id)
        got, ended, gen_rows = gen.shape[1], ended.tolist(), gen.cpu().tolist()
        for r, j in enumerate(rows):
            m = int(lengths[r]) if ended[r] else got  # a running row keeps every token of the chunk
            self.tokens[j] += gen_rows[r][:m]
            self.logps[j] += lp[r][:m]
            self.decoded += m
            if ended[r]:
                self.finish[j], self.eos[j] = step + m - 1, True
            elif step + got >= max_new_tokens:
                self.finish[j] = max_new_tokens - 1  # at the length cap: finished, truncated
        return got
