"""Training engines: one interface (`TrainEngine`), two implementations (DeepSpeed, PyTorch FSDP2).

The trainer, the updater, the trainer state and the checkpoints call only this interface; which engine runs is
`engine.backend` in the recipe (docs/engines.md). Each engine declares what it can do as `capabilities`, a
frozen set of the strings in `CAPABILITIES`, so a caller asks `"zero3_gather" in engine.capabilities` instead
of testing the engine's type.

    engine = make_engine("fsdp2", model, lr=..., grad_accum=4, ...)
    for micro in micro_batches:
        loss = objective(engine.module(...))
        engine.backward(loss, world)
        finite, norm = engine.step()          # applies the optimizer at the accumulation boundary
    engine.step_applied(), engine.grad_norm(norm), engine.lr()
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

BACKENDS = ("deepspeed", "fsdp2")

CAPABILITIES = {
    "zero3_gather": "parameters are partitioned by ZeRO-3 and gathered with deepspeed.zero.GatheredParameters",
    "sharded_params": "parameters are DTensors sharded over the data-parallel ranks (FSDP2)",
    "sharded_checkpoint": "each rank writes its own shard of the weights and optimizer state",
    "dcp_checkpoint": "checkpoints are torch.distributed.checkpoint (DCP) folders",
    "deepspeed_checkpoint": "checkpoints are DeepSpeed's own format (zero_to_fp32 merges them)",
    "cpu_offload": "parameters, gradients and optimizer state can live in host memory between steps",
    "mixed_precision": "bf16 compute over fp32 master weights, gradients reduced in fp32",
    "inplace_rollback": "state_dict() / load_state_dict() copy the whole engine in memory, bit for bit (MIPU)",
    "module_weight_push": "rollout backends read the policy's weights straight from `engine.module` (plain tensors)",
    "gathered_weight_push": "a weight push gathers the sharded parameters bucket by bucket (`weight_buckets`, "
                            "credo.distributed.engines.weights)",
    "lora": "trains a PEFT LoRA adapter (frozen base weights)",
}
"""Every capability an engine may declare, with what it promises."""


@runtime_checkable
class TrainEngine(Protocol):
    """What the trainer needs of a training engine."""

    backend: str
    """'deepspeed' or 'fsdp2'."""
    capabilities: frozenset[str]
    """What this engine can do (keys of `CAPABILITIES`)."""
    module: torch.nn.Module
    """The model to call for forwards (FSDP2: the sharded model itself; DeepSpeed: the engine's module)."""

    def set_accumulation_boundary(self, last: bool | None) -> None:
        """Say whether the next micro-batch ends the optimizer step (None: count to grad_accum)."""

    def backward(self, loss: torch.Tensor, world: int) -> None:
        """Backpropagate a loss normalised by global counts (no 1/grad_accum, no data-parallel averaging)."""

    def step(self) -> tuple[bool, float | None]:
        """Called after every micro-batch; at the boundary clip and apply the optimizer and LR schedule.
        Returns (gradients finite, the norm checked here or None)."""

    def step_applied(self) -> bool:
        """Whether the last boundary moved the weights (False: skipped for a non-finite gradient)."""

    def grad_norm(self, checked: float) -> float:
        """The global gradient norm of the last optimizer step (`checked`: the one `step` returned)."""

    def nan_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """A loss whose backward makes every gradient non-finite, so the whole optimizer step is skipped."""

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""

    def no_sync(self) -> contextlib.AbstractContextManager:
        """A context in which backward accumulates gradients without a data-parallel reduction."""

    def state_dict(self) -> dict:
        """A detached in-memory copy of everything an optimizer step changes (rollback)."""

    def load_state_dict(self, state: dict) -> None:
        """Put a `state_dict()` copy back, bit for bit."""

    def save_checkpoint(self, folder: Path) -> None:
        """Collective: write weights, optimizer, LR schedule and counters under `folder`."""

    def load_checkpoint(self, folder: Path) -> None:
        """Collective: read what `save_checkpoint` wrote; the recipe's optimizer settings win over the file's."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the policy's full weights, under the base model's names (LoRA merged), on the CPU."""

    def weight_buckets(self, bucket_bytes: int, dst: int | None):
        """Collective: the full weights a rollout engine is pushed, as buckets of (name, CPU tensor) under the base
        model's names, tied aliases once, at the dtype the module computes in (`credo.distributed.engines.weights`)."""

    def export(self, tokenizer, out_dir: Path, rank: int) -> Path | None:
        """Collective: the policy as a Hugging Face folder; rank 0 writes and returns it."""

    def param_digests(self) -> list[str]:
        """Collective: a digest of the full weights from every rank (replicas must agree)."""


def make_engine(backend: str, model: torch.nn.Module, **settings) -> TrainEngine:
    """The policy's training engine: `backend` is the recipe's engine.backend."""
    if backend == "deepspeed":
        from credo.distributed.engines.deepspeed import DeepSpeedEngine

        return DeepSpeedEngine.build(model, **settings)
    if backend == "fsdp2":
        from credo.distributed.engines.fsdp2 import FSDP2Engine

        return FSDP2Engine(model, **settings)
    raise ValueError(f"unknown engine backend {backend!r}: expected one of {BACKENDS}")


def check_engine(r) -> None:
    """The engine's own settings the chosen engine cannot honour, as a ConfigError naming the key (called by the run
    plan, before any long work).

    FSDP2's blocks hold DTensor shards, which every weight push gathers bucket by bucket through the engine
    (`weight_buckets`: the vLLM and Ray pushes, the rollout copy at another precision, overlap's weight buffer; a
    LoRA adapter merged). What each engine can push is declared in `credo.capabilities.ENGINES` and
    checked by the run plan, naming both keys.
    """
    from credo.errors import ConfigError

    if r.engine.backend == "deepspeed":
        if r.engine.cpu_offload:
            raise ConfigError("config key 'engine.cpu_offload' = true: an fsdp2 setting; expected engine.backend: "
                              "fsdp2 (or cpu_offload: false)")
        return
    # a push or LoRA an engine cannot make is a capability it lacks (credo.capabilities.ENGINES), refused by the run
    # plan naming both keys


def as_train_engine(engine) -> TrainEngine:
    """`engine` itself when it is a `TrainEngine`; a bare `deepspeed.DeepSpeedEngine` (from
    `credo.distributed.engine.build_engine`, as the critics and tests build them) behind the DeepSpeed adapter."""
    if hasattr(engine, "capabilities") and hasattr(engine, "backend"):
        return engine
    from credo.distributed.engines.deepspeed import DeepSpeedEngine

    return DeepSpeedEngine(engine, engine.zero_optimization_stage())
