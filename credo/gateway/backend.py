"""The one function through which the gateway samples, so the backend behind it can be swapped.

Today it wraps a rollout backend's `generate` (credo.distributed.rollout: `HFBackend`, the vLLM backend, the Ray
pool all share it). The generation service (its own issue) will provide the same call; only `backend_sampler`
changes. The contract: one `Sample` per prompt, in order, with `response_ids` (the tokens sampled, EOS included when
the answer finished), `rollout_log_probs` (the behaviour log-prob of each), `finished` and `policy_version`;
`seeds=None` decodes greedily.
"""

from __future__ import annotations

from typing import Callable, Protocol

from credo.distributed.rollout import Sample


class SampleFn(Protocol):
    def __call__(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None) -> list[Sample]: ...


def backend_sampler(backend) -> SampleFn:
    """A `SampleFn` over any object with the rollout backends' `generate(prompts, *, max_new_tokens, temperature,
    top_p, seeds)`."""
    generate: Callable = backend.generate

    def sample(prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
               seeds: list[int] | None) -> list[Sample]:
        out = generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seeds=seeds)
        if len(out) != len(prompts):
            raise RuntimeError(f"the rollout backend returned {len(out)} samples for {len(prompts)} prompts")
        return out

    return sample
