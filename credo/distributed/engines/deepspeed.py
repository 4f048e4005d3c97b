"""The DeepSpeed engine behind `TrainEngine`: a thin adapter over `deepspeed.DeepSpeedEngine`.

The DeepSpeed specifics (backward scaling, ZeRO-0's overflow check, the in-memory rollback, the optimizer
settings a resume reapplies) stay in `credo.distributed.engine`, which the critics' and the extractor's own
DeepSpeed engines use directly; this class only puts them behind the interface. Attributes it does not define
(`optimizer`, `lr_scheduler`, `global_steps`, `get_lr`, ...) are the DeepSpeed engine's, for tests and tools.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from credo.distributed import engine as ds

CKPT_TAG = "state"
"""The DeepSpeed checkpoint's tag: its files go to `<checkpoint>/state/` (credo.checkpoint.TAG)."""


class DeepSpeedEngine:
    """`TrainEngine` on DeepSpeed (ZeRO 0-3, torch AdamW)."""

    backend = "deepspeed"

    def __init__(self, engine, zero_stage: int):
        self.ds, self.zero_stage = engine, zero_stage
        self.module = engine.module
        caps = {"deepspeed_checkpoint", "module_weight_push", "lora"}
        caps |= {"zero3_gather", "sharded_checkpoint"} if zero_stage >= 3 else {"inplace_rollback"}
        if zero_stage >= 1:
            caps.add("sharded_checkpoint")
        self.capabilities = frozenset(caps)

    @classmethod
    def build(cls, model: torch.nn.Module, *, zero_stage: int, cpu_offload: bool = False,
              reshard_after_forward: bool = True, **settings) -> "DeepSpeedEngine":
        """`credo.distributed.engine.build_engine` (FSDP2's own settings are not DeepSpeed's: ignored)."""
        if cpu_offload:
            raise ValueError("engine.cpu_offload is an fsdp2 setting; DeepSpeed's offload is not wired in credo")
        return cls(ds.build_engine(model, zero_stage=zero_stage, **settings), zero_stage)

    def __getattr__(self, name):  # DeepSpeed's own attributes, for tests and tools (not the trainer)
        if name == "ds":
            raise AttributeError(name)
        return getattr(self.ds, name)

    def set_accumulation_boundary(self, last: bool | None) -> None:
        if last is not None:
            self.ds.set_gradient_accumulation_boundary(last)

    def backward(self, loss: torch.Tensor, world: int) -> None:
        ds.backward(self.ds, loss, world)

    def step(self) -> tuple[bool, float | None]:
        return ds.optimizer_step(self.ds, self.zero_stage)

    def step_applied(self) -> bool:
        return bool(self.ds.was_step_applied())

    def grad_norm(self, checked: float) -> float:
        return ds.reported_grad_norm(self.ds, checked)

    def nan_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return ds.nan_loss(self.ds)

    def lr(self) -> float:
        return self.ds.get_lr()[0]

    def no_sync(self):
        return contextlib.nullcontext()  # DeepSpeed reduces at its accumulation boundary by itself

    def state_dict(self) -> dict:
        return ds.engine_state_dict(self.ds)

    def load_state_dict(self, state: dict) -> None:
        ds.load_engine_state_dict(self.ds, state)

    def save_checkpoint(self, folder: Path) -> None:
        self.ds.save_checkpoint(str(folder), tag=CKPT_TAG, save_latest=False)

    def load_checkpoint(self, folder: Path) -> None:
        load_path, _ = self.ds.load_checkpoint(str(folder), tag=CKPT_TAG, load_optimizer_states=True,
                                               load_lr_scheduler_states=True)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {folder}")
        ds.reapply_optimizer_settings(self.ds)  # the recipe's lr, betas, weight decay (a resume may change them)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from credo.lora import policy_state_dict

        gather = contextlib.nullcontext()
        if self.zero_stage >= 3:
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        with gather:
            return {k: v.detach().cpu().clone() for k, v in policy_state_dict(self.module).items()}

    def weight_buckets(self, bucket_bytes: int = 0, dst: int | None = None):
        """The weights a push reads: `weight_sync.full_state_dict` (ZeRO 0-2: views of the live tensors) cut into
        buckets of `bucket_bytes` (0: one bucket), on every rank (`dst`: unused); ZeRO-3: each bucket's parameters
        gathered, copied to the CPU and released in turn (`weight_sync.zero3_buckets`, a collective)."""
        from credo.distributed.engines.weights import split_buckets
        from credo.distributed.weight_sync import full_state_dict, zero3_buckets

        if self.zero_stage >= 3:
            yield from zero3_buckets(self.module, bucket_bytes)
            return
        state = full_state_dict(self.module)
        if not bucket_bytes:
            yield list(state.items())
            return
        yield from split_buckets(state.items(), bucket_bytes)

    def export(self, tokenizer, out_dir: Path, rank: int) -> Path | None:
        from credo.export import export_model

        return export_model(self.module, tokenizer, out_dir, zero_stage=self.zero_stage, rank=rank)

    def param_digests(self) -> list[str]:
        return ds.param_digests(self.module)
