"""DeepSpeed on CPU or GPU: process-group setup, the policy engine, and small collective helpers.

One process by default; the same code runs data-parallel under `torchrun` or the `deepspeed` launcher
(gloo on CPU). On CPU, DeepSpeed compiles a communication op once; it is cached in the project's
ignored cache folder (TORCH_EXTENSIONS_DIR), so runs after the first skip the compile.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from credo.models import cache_root


DIST_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK")
"""Process-group variables a launcher (or an in-process trainer, see setup_distributed) sets; a child run
started from such a process must drop them to be a world of its own."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed() -> tuple[int, int]:
    """Initialise the process group (a world of one when not launched); return (rank, world_size)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root().parent / "torch_extensions"))
    if "RANK" not in os.environ:  # plain `credo run`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
    return dist.get_rank(), dist.get_world_size()


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def build_engine(model: torch.nn.Module, *, lr: float, betas, weight_decay: float, grad_clip: float,
                 zero_stage: int, warmup_steps: int, micro_batch: int, grad_accum: int, bf16: bool):
    """Wrap the policy in a DeepSpeed engine with a torch AdamW (no extra op compile) and linear warm-up."""
    import deepspeed

    world = dist.get_world_size()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world,
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    return engine


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum across ranks, returned on x's device (NCCL needs the GPU copy); a copy of x in a world of one."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return x.clone()
    y = x.to(device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y.to(x.device)


def all_gather_cat(x: torch.Tensor) -> torch.Tensor:
    """Concatenate equally-shaped tensors from all ranks along dim 0, returned on x's device."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return x
    y = x.to(device()).contiguous()
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts, 0).to(x.device)


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
