"""Tail batching (RollPacker, arXiv 2509.21009): a synchronous, on-policy rollout source that stops waiting for the
longest responses.

`stages.schedule: tail_batching`, with `stages.schedule_kwargs` {prompt_ratio, max_responses, chunk_tokens}
(`TailBatchingSettings`; the deprecated `rollout.tail_batching: {...}` still maps here). It needs a source that
draws single-turn prompts itself (capability `prompt_draw`: the default source) and a backend that can race
(`race`: hf, vLLM and the Ray pool, which runs the race on one worker). A step trains on P0 prompts x R0 responses (`rollout.prompts_per_step` x
`rollout.group_size`).

- **Short round** (the default): launch ceil(eta_P * P0) new prompts with R' > R0 responses each
  (`prompt_ratio`, `max_responses`). A prompt is complete once R0 of its responses have
  finished; it keeps those R0 (the first to finish). The round ends as soon as P0 prompts are complete
  (`credo.distributed.race`); every response still running is aborted, and the prompts that did not complete go to
  the **long-prompt queue**.
- **Long round**: when the queue holds >= P0 prompts, the step takes the P0 oldest and samples exactly R0 responses
  each, to full length, with no speculation.

Every sample of a step comes from the current weights, so the update stays on-policy; long prompts are delayed, not
dropped. Prompts are drawn without replacement from a seeded permutation of the training problems per epoch, and a
prompt moved to the queue counts as drawn, so each epoch trains every prompt once (`rollout/epoch` counts the
queued ones); the draw position and the queue are the source's state, saved in every checkpoint. Seeds are
functions of (run seed, step, prompt draw, response index), so a resumed run draws what an uninterrupted one does.

What each backend does: `credo.distributed.rollout.HFBackend.generate_race` (chunks of generate with the KV cache
carried over, finished and no-longer-needed rows dropped between chunks) and
`credo.distributed.vllm_backend.VLLMBackend.generate_race` (requests aborted after each engine step).

Data-parallel runs: each rank runs its own rounds on its P0 / world prompts and keeps its own queue (its draws
interleave with the other ranks' in one permutation); `state_dict` gathers every rank's state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from credo.capabilities import PROMPT_DRAW, RACE
from credo.config.fields import ranged
from credo.distributed.service_client import generate_through
from credo.errors import ConfigError
from credo.schedules import Schedule
from credo.tasks.render import encode_prompts, plain_prompt
from credo.train.batch import Batch
from credo.train.rollout import PromptRollout, step_seed


class TailBatchingRollout(PromptRollout):
    """The default single-turn source with RollPacker's short and long rounds (see the module docstring).

    Args:
        prompt_ratio: eta_P >= 1, prompts launched per short round over P0.
        max_responses: R' >= R0, responses launched per prompt in a short round.
        chunk_tokens: hf backend: tokens generated per call between the race's checks.
    """

    def __init__(self, task, tokenizer, backend, *, prompt_ratio: float, max_responses: int, chunk_tokens: int,
                 seed: int, prompts_per_step: int, group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float, rank: int = 0, world: int = 1, render=plain_prompt, holdout: int = 0):
        super().__init__(task, tokenizer, backend, seed=seed, prompts_per_step=prompts_per_step,
                         group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                         rank=rank, world=world, render=render, holdout=holdout)
        if not hasattr(backend, "generate_race"):
            raise ValueError(f"rollout.tail_batching needs a backend that can stop requests early (generate_race); "
                             f"{type(backend).__name__} has none")
        if prompt_ratio < 1 or max_responses < group_size:
            raise ValueError(f"prompt_ratio {prompt_ratio} and max_responses {max_responses}: expected >= 1 and "
                             f">= group_size ({group_size})")
        self.prompt_ratio, self.max_responses, self.chunk_tokens = prompt_ratio, max_responses, chunk_tokens
        self.local_prompts = prompts_per_step // world
        self.drawn = 0
        """Prompts this rank has drawn (trained, or in its queue)."""
        self.queue: list[int] = []
        """Draw numbers of this rank's prompts that lost a short round, oldest first."""
        self._perm: tuple[int, list[int]] | None = None

    # ---- the draw: epochs of a seeded permutation, ranks interleaved
    def problem_index(self, draw: int) -> int:
        """The training problem of this rank's `draw`-th prompt (global position draw * world + rank)."""
        n = len(self.task) - self.holdout
        position = draw * self.world + self.rank
        epoch = position // n
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(step_seed(self.seed, epoch, "tail-batching-epoch"))
            self._perm = (epoch, torch.randperm(n, generator=gen).tolist())
        return self._perm[1][position % n]

    def epoch(self) -> float:
        """Epochs of the training problems drawn so far (all ranks), queued prompts counted."""
        return self.drawn * self.world / (len(self.task) - self.holdout)

    def _prompt_ids(self, draws: list[int]) -> tuple[list, list[list[int]]]:
        problems = [self.task.train(self.problem_index(d)) for d in draws]
        return problems, encode_prompts(self.tokenizer, self.render, problems)

    def _seeds(self, step: int, draws: list[int], responses: int) -> list[int]:
        return [step_seed(self.seed, step, f"tb:{d}:{r}") for d in draws for r in range(responses)]

    # ---- rounds
    def rollout(self, step: int) -> Batch:
        if len(self.queue) >= self.local_prompts:
            draws, self.queue = self.queue[:self.local_prompts], self.queue[self.local_prompts:]
            problems, prompt_ids = self._prompt_ids(draws)
            samples = generate_through(  # a long round: the queued prompts, through the engine's service
                self.service, [ids for ids in prompt_ids for _ in range(self.G)], max_new_tokens=self.max_new_tokens,
                temperature=self.temperature, top_p=self.top_p, seeds=self._seeds(step, draws, self.G))
            kept = [(i, samples[i * self.G:(i + 1) * self.G]) for i in range(len(draws))]
            stats = {"rollout/long_round": 1.0, "rollout/aborted_responses": 0.0, "rollout/queued_prompts": 0.0,
                     "rollout/decoded_tokens": float(sum(len(s.response_ids) for s in samples))}
        else:
            draws = list(range(self.drawn, self.drawn + math.ceil(self.prompt_ratio * self.local_prompts)))
            self.drawn += len(draws)
            problems, kept, stats = self._short_round(step, draws)
        batch = self._batch(step, [problems[i] for i, _ in kept], [group for _, group in kept])
        lengths = [len(s.response_ids) for s in batch.samples]
        batch.metrics.update(stats)
        batch.metrics.update({"rollout/queue_len": float(len(self.queue)), "rollout/epoch": self.epoch(),
                              "rollout/response_len_mean": sum(lengths) / len(lengths),
                              "rollout/response_len_max": float(max(lengths))})
        return batch

    def _short_round(self, step: int, draws: list[int]):
        """Race ceil(eta_P * P0) prompts x R'; the losers join the queue. Returns the problems, the winners as
        (prompt position, its R0 samples) in completion order, and the round's metrics."""
        from credo.distributed.race import race_winners

        problems, prompt_ids = self._prompt_ids(draws)
        R = self.max_responses
        result = self.backend.generate_race(
            [ids for ids in prompt_ids for _ in range(R)], [i for i in range(len(draws)) for _ in range(R)],
            need=self.G, groups_needed=self.local_prompts, max_new_tokens=self.max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, seeds=self._seeds(step, draws, R),
            chunk_tokens=self.chunk_tokens)
        winners = race_winners(result.finish_steps, [j // R for j in range(len(result.samples))], need=self.G,
                               groups_needed=self.local_prompts)
        if winners is None:
            raise RuntimeError(f"step {step}: fewer than {self.local_prompts} prompts completed a short round")
        won = {i for i, _ in winners}
        self.queue += [d for i, d in enumerate(draws) if i not in won]
        kept = [(i, [result.samples[j] for j in requests]) for i, requests in winners]
        stats = {"rollout/long_round": 0.0,
                 "rollout/aborted_responses": float(len(result.samples) - self.local_prompts * self.G),
                 "rollout/queued_prompts": float(len(draws) - len(won)),
                 "rollout/decoded_tokens": float(result.decoded_tokens)}
        return problems, kept, stats

    def _batch(self, step: int, problems: list, groups: list[list]) -> Batch:
        first = self.rank * self.local_prompts  # group ids are global across ranks
        samples = [s for group in groups for s in group]
        group_ids = torch.tensor([first + i for i, group in enumerate(groups) for _ in group])
        return Batch(samples=samples, problems=[p for p, group in zip(problems, groups) for _ in group],
                     group_ids=group_ids, step=step)

    # ---- state: the draw position and the queue (every rank's)
    def state_dict(self) -> dict:
        mine = {"drawn": self.drawn, "queue": list(self.queue)}
        if self.world == 1 or not dist.is_initialized():
            return {"ranks": [mine]}
        ranks: list = [None] * self.world
        dist.all_gather_object(ranks, mine)
        return {"ranks": ranks}

    def load_state_dict(self, state: dict) -> None:
        mine = state["ranks"][self.rank]
        self.drawn, self.queue = int(mine["drawn"]), [int(d) for d in mine["queue"]]


@dataclass
class TailBatchingSettings:
    prompt_ratio: float = ranged(1.25, ge=1)
    """eta_P: a short round launches ceil(prompt_ratio * prompts_per_step) prompts (RollPacker's default 1.25)."""
    max_responses: int = ranged(0, ge=0, note="0 = group_size + 1")
    """R': responses launched per prompt in a short round, >= group_size; 0 = group_size + 1 (RollPacker's)."""
    chunk_tokens: int = ranged(8, ge=1)
    """hf backend: tokens generated per generate() call between the checks that drop finished requests."""


def check(r, s: TailBatchingSettings, key: str) -> None:
    """max_responses against the recipe's group size."""
    if s.max_responses and s.max_responses < r.rollout.group_size:
        raise ConfigError(f"config key '{key}.max_responses' = {s.max_responses} is out of range: expected >= "
                          f"rollout.group_size ({r.rollout.group_size}), or 0 for group_size + 1")


def wrap(source, ctx, s: TailBatchingSettings) -> TailBatchingRollout:
    """The default source's draw, scheduled in short and long rounds (the same task, backend and sampling)."""
    if not isinstance(source, PromptRollout):  # the plan refuses this first (capability prompt_draw)
        raise TypeError(f"tail batching schedules a PromptRollout, got {type(source).__name__}")
    return TailBatchingRollout(source.task, source.tokenizer, source.backend, prompt_ratio=s.prompt_ratio,
                               max_responses=s.max_responses or source.G + 1, chunk_tokens=s.chunk_tokens,
                               seed=source.seed, prompts_per_step=source.P, group_size=source.G,
                               max_new_tokens=source.max_new_tokens, temperature=source.temperature, top_p=source.top_p,
                               rank=source.rank, world=source.world, render=source.render, holdout=source.holdout)


SCHEDULE = Schedule(name="tail_batching", doc="RollPacker's tail batching: short rounds race extra prompts, the "
                    "stragglers wait for a long round (arXiv 2509.21009)", settings=TailBatchingSettings, wrap=wrap,
                    source_needs=frozenset({PROMPT_DRAW}), backend_needs=frozenset({RACE}), check=check)
