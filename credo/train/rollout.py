"""Rollout sources: prompts -> samples. Single-turn today; multi-turn and asynchronous sources plug in here.

    class RolloutSource(Protocol):
        def rollout(self, step: int) -> Batch          # this rank's samples, problems and group ids
        def sync(self, model, step: int) -> None       # the rollout engine takes the new weights
        def generate(self, prompts, **sampling)         # raw sampling, for evaluation and judges
        def state_dict(self) -> dict / load_state_dict  # Stateful: a source's position in its data
        def close(self) -> None

The step's prompts and every sampling seed are functions of (run seed, step), so a resumed run draws
the same prompts and responses as an uninterrupted one and the source has no position to save.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import torch

from credo.distributed.service_client import as_service, generate_through
from credo.tasks.render import encode_prompts, plain_prompt
from credo.train.batch import Batch


class RolloutSource(Protocol):
    def rollout(self, step: int) -> Batch: ...

    def sync(self, model: torch.nn.Module, step: int) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def step_seed(seed: int, step: int, salt: int) -> int:
    """A 31-bit seed that is a pure function of (seed, step, salt)."""
    h = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def step_problem_indices(seed: int, step: int, n_problems: int, prompts_per_step: int) -> list[int]:
    """The training problems of `step` (all ranks), deterministic in seed and step."""
    gen = torch.Generator().manual_seed(step_seed(seed, step, 0))
    return torch.randint(0, n_problems, (prompts_per_step,), generator=gen, device="cpu").tolist()


class PromptRollout:
    """Single-turn rollout: each rank samples `group_size` responses to its share of the step's prompts.

    Temperature and top-p are bound here once; the scorer that recomputes log-probs is built with the
    same temperature by the builder. `holdout` > 0 keeps the last `holdout` training problems out of the
    draw (held-out training prompts for MIPU's validation). `routing` asks the engine to record each token's MoE
    experts (`Sample.routed_experts`). `render(problem) -> str` is the recipe's prompt rendering
    (`credo.tasks.render.prompt_renderer`: the chat template, if any), shared with warm-up and evaluation.
    """

    def __init__(self, task, tokenizer, backend, *, seed: int, prompts_per_step: int, group_size: int,
                 max_new_tokens: int, temperature: float, top_p: float, rank: int = 0, world: int = 1,
                 render=plain_prompt, holdout: int = 0, top_k: int = 0, min_p: float = 0.0,
                 kept_set_replay: bool = False, routing: bool = False):
        self.task, self.tokenizer, self.backend, self.render = task, tokenizer, backend, render
        self.seed, self.P, self.G = seed, prompts_per_step, group_size
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        # top-k / min-p and kept-set replay (docs/truncated_sampling.md) reach the engine only when set, so an engine
        # (or a test double) without them serves every other recipe unchanged
        self.truncation = {k: v for k, v in (("top_k", top_k), ("min_p", min_p)) if v}
        self.kept_rule = None
        if top_k or min_p or top_p < 1:  # the batch says how it was truncated (and logs mismatch/ratio_mean)
            self.kept_rule = dict(top_k=top_k, top_p=top_p, min_p=min_p,
                                  order=getattr(backend, "kept_set_order", "hf"), replay=kept_set_replay)
            if kept_set_replay:
                self.truncation["kept_set"] = True
        if routing:  # an MoE policy on the hf backend records its routing (docs/moe.md); asked only then, as above
            self.truncation["routing"] = True
        self.rank, self.world = rank, world
        if not 0 <= holdout < len(task):
            raise ValueError(f"holdout is {holdout}, expected 0 <= holdout < {len(task)} (the training problems)")
        self.holdout = holdout  # the last `holdout` training problems are never drawn (MIPU's validation prompts)

    @property
    def service(self):
        """The engine's generation service, this rollout being its client; made again when `backend` is replaced (a
        family wraps it after construction: palette's LatentBackend on a copy of this source)."""
        if getattr(self, "_service_of", None) is not self.backend:
            self._service, self._service_of = as_service(self.backend), self.backend
        return self._service

    def rollout(self, step: int) -> Batch:
        P, G = self.P, self.G
        idx = step_problem_indices(self.seed, step, len(self.task) - self.holdout, P)
        per_rank = P // self.world
        mine = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))
        problems = [self.task.train(idx[i]) for i in mine]
        prompt_ids = encode_prompts(self.tokenizer, self.render, problems)
        prompts = [ids for ids in prompt_ids for _ in range(G)]
        seeds = [step_seed(self.seed, step, 1 + i * G + g) for i in mine for g in range(G)]
        samples = generate_through(self.service, prompts, max_new_tokens=self.max_new_tokens,
                                   temperature=self.temperature, top_p=self.top_p, seeds=seeds, **self.truncation)
        group_ids = torch.tensor([i for i in mine for _ in range(G)], device="cpu")
        return Batch(samples=samples, problems=[p for p in problems for _ in range(G)], group_ids=group_ids, step=step,
                     kept_rule=self.kept_rule)

    def generate(self, prompts: list[list[int]], *, temperature: float, seeds: list[int] | None):
        """Sample (or, with `seeds=None`, greedily decode) one response per prompt at the rollout's length cap."""
        return generate_through(self.service, prompts, max_new_tokens=self.max_new_tokens, temperature=temperature,
                                top_p=1.0, seeds=seeds)

    def sync(self, model: torch.nn.Module, step: int) -> None:
        self.service.load_weights(model, step)

    def state_dict(self) -> dict:
        return {}  # prompts and seeds are functions of (seed, step): nothing to save

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        self.backend.close()
