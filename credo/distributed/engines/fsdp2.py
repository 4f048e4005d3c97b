"""The PyTorch FSDP2 engine behind `TrainEngine` (`torch.distributed.fsdp.fully_shard`, no dependency beyond torch).

Layout. Each transformer block (the model's `_no_split_modules`, e.g. Qwen2DecoderLayer) is one `fully_shard`
unit: its parameters are DTensors sharded over the data-parallel ranks, gathered for its forward and backward
and freed after (`reshard_after_forward`). The embeddings, the final norm and the output head are left
replicated, plain tensors: credo's log-prob kernel reads `lm_head.weight` directly (the hidden-state path,
`credo.algos.logprobs_from_hidden`), outside any module forward that FSDP could hook, and a tied head is the
embedding itself. Their gradients are averaged over ranks at the accumulation boundary, as FSDP's
reduce-scatter averages the blocks'.

Maths. Gradient clipping and the optimizer follow DeepSpeed ZeRO-1/2 with a torch AdamW exactly: the global norm
is sqrt(sum ||g_p||^2) with each ||g_p|| in float64, summed in parameter order, the clip factor is
max(1, (norm + 1e-6) / clip) and every gradient is multiplied by its reciprocal; a non-finite norm skips the step
(no weight, moment or LR moves). On one process this gives DeepSpeed's metrics bit for bit (docs/engines.md).

Mixed precision (model.dtype: bfloat16): the sharded master weights are fp32, blocks compute in bf16 and reduce
gradients in fp32 (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`). CPU offload
(`engine.cpu_offload`) keeps the sharded weights, gradients and optimizer state in host memory.
Checkpoints are DCP folders (`torch.distributed.checkpoint`), each rank writing its shards.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from credo.distributed import engine as common
from credo.distributed.engines import weights

DCP_FOLDER = "dcp"
"""The DCP checkpoint's folder inside a credo checkpoint; its LR schedule and counters go to `dcp_extra.pt`."""
_COUNTERS = ("global_steps", "micro_steps", "skipped_steps")


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class is in `_no_split_modules` (transformers' own list)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"engine.backend=fsdp2: {type(model).__name__} names no transformer block class "
                         "(_no_split_modules); FSDP2 shards per block")
    return blocks


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class FSDP2Engine:
    """`TrainEngine` on FSDP2 with a torch AdamW and DeepSpeed's clipping and LR schedule."""

    backend = "fsdp2"
    capabilities = frozenset({"sharded_params", "sharded_checkpoint", "dcp_checkpoint", "cpu_offload",
                              "mixed_precision", "inplace_rollback", "gathered_weight_push", "lora"})

    def __init__(self, model: torch.nn.Module, *, lr: float, betas, weight_decay: float, grad_clip: float,
                 warmup_steps: int, grad_accum: int, bf16: bool, lr_schedule: str = "constant", total_steps: int = 0,
                 min_lr_ratio: float = 0.0, micro_batch: int = 0, zero_stage: int = 0, cpu_offload: bool = False,
                 reshard_after_forward: bool = True):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        self.world = dist.get_world_size()
        dev = common.device()
        if bf16:  # fp32 master weights; the blocks compute in bf16
            model.float()
        if not cpu_offload:
            model.to(dev)
        mesh = init_device_mesh(dev.type, (self.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload,
                        reshard_after_forward=reshard_after_forward)
        self.module = model
        self.push_dtype = torch.bfloat16 if bf16 else None  # DeepSpeed's bf16 module pushes bf16 weights
        weights.register(model, self)  # a weight push handed `model` gathers through `weight_buckets`
        self.grad_clip, self.grad_accum = grad_clip, grad_accum
        trainable = [p for p in model.parameters() if p.requires_grad]
        self._params = trainable  # parameter order: the norm sums in it, as DeepSpeed does
        sharded = [p for p in trainable if isinstance(p, DTensor)]
        replicated = [p for p in trainable if not isinstance(p, DTensor)]
        self._replicated = replicated
        # one param group per kind: a foreach AdamW (GPU) cannot mix DTensors and plain tensors in one call
        groups = [{"params": g} for g in (sharded, replicated) if g]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        if lr_schedule == "constant":  # DeepSpeed's engine's lambda (credo.distributed.engine.build_engine)
            factor = lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0  # noqa: E731
        else:
            factor = functools.partial(common.lr_factor, warmup_steps=warmup_steps, schedule=lr_schedule,
                                       total_steps=total_steps, min_lr_ratio=min_lr_ratio)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.credo_optimizer_settings = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.global_steps = self.micro_steps = self.skipped_steps = 0
        self._boundary: bool | None = None
        self._applied, self._norm = True, float("nan")

    # ------------------------------------------------------------------ the step
    def _is_boundary(self) -> bool:
        return self._boundary if self._boundary is not None else (self.micro_steps + 1) % self.grad_accum == 0

    def set_accumulation_boundary(self, last: bool | None) -> None:
        self._boundary = last

    def backward(self, loss: torch.Tensor, world: int) -> None:
        # FSDP averages the blocks' gradients over ranks: x world undoes it (the loss is globally normalised)
        if self.world > 1:  # no reduce-scatter until the micro-batch that ends the step
            self._set_sync(self._is_boundary())
        (loss * world).backward()

    def _set_sync(self, sync: bool) -> None:
        from torch.distributed.fsdp import FSDPModule

        for m in self.module.modules():
            if isinstance(m, FSDPModule):
                m.set_requires_gradient_sync(sync, recurse=False)

    def no_sync(self):
        @contextlib.contextmanager
        def ctx():
            self._set_sync(False)
            try:
                yield
            finally:
                self._set_sync(True)
        return ctx()

    def step(self) -> tuple[bool, float | None]:
        boundary = self._is_boundary()
        self.micro_steps += 1
        self._boundary = None
        if not boundary:
            return True, None
        self._average_replicated_grads()
        norm = self._global_norm()
        self._norm = float(norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.global_steps += 1
            self._applied = False
            return False, self._norm
        if self.grad_clip > 0:  # DeepSpeed's unscale_and_clip_grads, loss scale 1
            clip = torch.clamp((norm + 1e-6) / self.grad_clip, min=1.0)
            for p in self._params:
                if p.grad is not None:
                    _local(p.grad).mul_(1.0 / clip)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1
        self._applied = True
        return True, self._norm

    def _average_replicated_grads(self) -> None:
        if self.world == 1:
            return
        for p in self._replicated:
            if p.grad is not None:
                g = p.grad.to(common.device())
                dist.all_reduce(g, op=dist.ReduceOp.SUM)
                p.grad.copy_(g / self.world)

    def _global_norm(self) -> torch.Tensor:
        """DeepSpeed ZeRO-1/2's global norm: float64 per-parameter norms summed in order (replicated parameters
        counted once over the ranks), then the group norm combined as DeepSpeed combines groups."""
        rank = dist.get_rank()
        norms = []
        for p in self._params:
            if p.grad is None:
                continue
            n = torch.linalg.vector_norm(_local(p.grad).detach().double())
            norms.append(n if isinstance(p, DTensor) or rank == 0 else torch.zeros_like(n))
        if not norms:
            return torch.zeros((), dtype=torch.float32, device="cpu")
        total = torch.stack(norms).pow(2).sum().float()
        if self.world > 1:
            total = common.all_reduce_sum(total)
        total = total.pow(0.5)
        return torch.linalg.vector_norm(torch.stack([total]), ord=2)

    def step_applied(self) -> bool:
        return self._applied

    def grad_norm(self, checked: float) -> float:
        return self._norm

    def nan_loss(self, loss: torch.Tensor) -> torch.Tensor:
        # the loss itself: its backward runs through every block's FSDP hooks (the reductions stay in step over
        # ranks) and poisons the gradients, so the norm check skips the step
        return loss * float("nan")

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"module": {k: v.detach().clone() for k, v in self.module.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "scheduler": copy.deepcopy(self.lr_scheduler.state_dict()),
                "counters": {a: getattr(self, a) for a in _COUNTERS}}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            live = self.module.state_dict()
            for k, v in state["module"].items():
                live[k].copy_(v)
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.lr_scheduler.load_state_dict(state["scheduler"])
        for a, v in state["counters"].items():
            setattr(self, a, v)
        self.module.zero_grad(set_to_none=True)

    def save_checkpoint(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / DCP_FOLDER))
        if dist.get_rank() == 0:
            torch.save({"scheduler": self.lr_scheduler.state_dict(),
                        "counters": {a: getattr(self, a) for a in _COUNTERS}}, Path(folder) / "dcp_extra.pt")

    def load_checkpoint(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (Path(folder) / DCP_FOLDER).is_dir():
            raise RuntimeError(f"checkpoint {folder} holds no FSDP2 (DCP) state: it was written by another engine "
                               "(engine.backend)")
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(Path(folder) / DCP_FOLDER))
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = torch.load(Path(folder) / "dcp_extra.pt", weights_only=False)
        self.lr_scheduler.load_state_dict(extra["scheduler"])
        for a, v in extra["counters"].items():
            setattr(self, a, v)
        common.reapply_optimizer_settings(self)  # the recipe's lr, betas, weight decay (a resume may change them)

    # ------------------------------------------------------------------ full weights
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every rank gets the full weights on the CPU (gathered one parameter at a time); with a LoRA adapter,
        merged under the base model's names (as DeepSpeed's `credo.lora.policy_state_dict`), at the master dtype."""
        from credo.lora import has_lora

        if has_lora(self.module):
            return {k: v for b in weights.gather_buckets(self.module, dtype=None, rank=dist.get_rank()) for k, v in b}
        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
                for k, v in self.module.state_dict().items()}

    def weight_buckets(self, bucket_bytes: int = weights.BUCKET_BYTES, dst: int | None = None):
        """Collective: the full weights for a push, bucket by bucket (`credo.distributed.engines.weights`), at the
        dtype the blocks compute in, tied aliases once; ranks other than `dst` (None: all) get empty buckets."""
        return weights.gather_buckets(self.module, dtype=self.push_dtype, bucket_bytes=bucket_bytes, dst=dst,
                                      rank=dist.get_rank())

    def export(self, tokenizer, out_dir: Path, rank: int) -> Path | None:
        from credo.export import write_hf_folder

        state = self.full_state_dict()  # collective
        if rank != 0:
            return None
        return write_hf_folder(self.module, tokenizer, Path(out_dir), state)

    def param_digests(self) -> list[str]:
        h = hashlib.sha256()
        for name, p in self.module.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(name.encode())
            h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
        out = [h.hexdigest()]
        if self.world > 1:
            out = [None] * self.world
            dist.all_gather_object(out, h.hexdigest())
        return out
