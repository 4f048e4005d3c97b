"""DeepSpeed on CPU or GPU: process-group setup, the policy engine, and small collective helpers.

One process by default; the same code runs data-parallel under `torchrun` or the `deepspeed` launcher
(gloo on CPU). On CPU, DeepSpeed compiles a communication op once (about 1-2 minutes) into TORCH_EXTENSIONS_DIR,
by default a per-user cache with a folder per Python environment (`torch_extensions_dir`), so runs after the first,
in any folder, skip the compile; the first says so before it starts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import math
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

DIST_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK")
"""Process-group variables a launcher (or an in-process trainer, see setup_distributed) sets; a child run
started from such a process must drop them to be a world of its own."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHM_COMM_OP = "deepspeed_shm_comm"
"""The op DeepSpeed builds with g++ the first time it initialises on CPU."""


def python_env_tag() -> str:
    """A folder name for this Python environment: torch's version and a hash of `sys.prefix` (the venv).

    A build of DeepSpeed's op is compiled against one environment's torch and DeepSpeed headers; torch keeps one
    build per op name in a folder and ninja rebuilds it whenever the compile command changes. Two venvs sharing one
    folder (a clone's `.venv` beside another checkout's) therefore rebuilt the op at every switch, each time 1-5
    minutes with no line said, since a `.so` was there (issue 57's round-4 trial: six builds in 30 minutes)."""
    digest = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return f"torch{torch.__version__.split('+')[0]}-{digest}"


def torch_extensions_dir() -> Path:
    """Where torch builds and finds C++ ops: $TORCH_EXTENSIONS_DIR, else `credo/torch_extensions/<env>` in the
    user's cache ($XDG_CACHE_HOME or ~/.cache): one build per user and Python environment (`python_env_tag`),
    whatever folder a run starts in."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "credo" / "torch_extensions"
    return base / python_env_tag()


def op_build_notice(extensions_dir: Path, op: str = SHM_COMM_OP) -> str | None:
    """The line to show before DeepSpeed loads `op`: None when its build is already in `extensions_dir`."""
    if (extensions_dir / op / f"{op}.so").is_file():
        return None
    return (f"credo: DeepSpeed is compiling its CPU op '{op}' into {extensions_dir} (once per user and Python "
            "environment, about 1-2 minutes with no other output; later runs reuse it)")


def load_cpu_comm_op(extensions_dir: Path, *, verbose: bool = False, wait_s: float = 900.0) -> None:
    """Build (the first time) and load DeepSpeed's CPU comm op while holding a kernel lock, before init_distributed.

    torch guards a build with a lock *file* (`<dir>/<op>/lock`). A build killed mid-compile (SIGKILL, a test's
    subprocess timeout) leaves it behind, and every later load of the op, built or not, then waits on it forever:
    torch's FileBaton has no timeout, and a whole test suite once stalled on it. Here every credo process loads
    the op only while it holds an flock on `<dir>/<op>.credo-lock`, which the kernel drops when its holder dies;
    so a torch lock file found while holding it was left by a dead build, and is removed (saying so). DeepSpeed
    keeps the loaded op per process, so init_distributed does not take torch's lock again. The flock is held for
    the build only, never across the rendezvous, so ranks started together on one machine take turns without
    waiting on each other. A holder still alive after `wait_s` (a build hung) is an error naming the lock file.
    """
    import fcntl
    import time

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return  # DeepSpeed falls back to plain gloo: nothing to build
    extensions_dir.mkdir(parents=True, exist_ok=True)
    with open(extensions_dir / f"{builder.NAME}.credo-lock", "a") as held:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"DeepSpeed's CPU op is still being built by another process after {wait_s:.0f} s "
                                       f"(it holds {held.name}); if that build hangs, end it") from None
                time.sleep(0.2)
        for stale in extensions_dir.glob("*/lock"):
            print(f"credo: removing {stale}, a build lock left by a build that was killed", file=sys.stderr, flush=True)
            stale.unlink(missing_ok=True)
        with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO()):
            builder.load(verbose=verbose)


def setup_distributed(*, verbose: bool = False, backend: str = "deepspeed") -> tuple[int, int]:
    """Initialise the process group (a world of one when not launched); return (rank, world_size).

    With the deepspeed engine, through DeepSpeed (which loads, and the first time builds, its CPU comm op);
    with fsdp2, torch's own `init_process_group` (nccl on GPU, gloo on CPU): no DeepSpeed import, no op build.
    DeepSpeed prints 'DeepSpeed ... deepspeed_shm_comm_op built successfully' to stdout each time it
    loads its CPU communication op (a cached build too); unless `verbose`, that print is swallowed.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
    if "RANK" not in os.environ:  # plain `credo run`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if backend == "fsdp2":
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(device())
            dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        return dist.get_rank(), dist.get_world_size()
    import deepspeed

    if not dist.is_initialized():
        notice = op_build_notice(torch_extensions_dir()) if os.environ.get("DS_ACCELERATOR") == "cpu" else None
        if notice and os.environ.get("LOCAL_RANK", "0") == "0":  # one line per machine, not per process
            print(notice, file=sys.stderr, flush=True)
        if os.environ.get("DS_ACCELERATOR") == "cpu":
            load_cpu_comm_op(torch_extensions_dir(), verbose=verbose)
        quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
        with quiet:
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
    return dist.get_rank(), dist.get_world_size()


def teardown_distributed() -> None:
    """After a finished multi-process run, wait for every rank and destroy the process group.

    Left to the interpreter's exit, the gloo group's threads can outlive it and abort a rank with 'terminate called
    without an active exception' after all its work is done (two CI runs, 2026-12-05 and 12-06: the outputs
    written, the launcher still failing). A world of one is left alone: in-process callers keep their group.
    """
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def lr_factor(s: int, *, warmup_steps: int, schedule: str = "constant", total_steps: int = 0,
              min_lr_ratio: float = 0.0) -> float:
    """The LR multiplier after `s` optimizer steps: linear warm-up, then constant or a linear / cosine decay
    that reaches `min_lr_ratio` at `total_steps` (and stays there)."""
    warm = min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "constant" or total_steps <= warmup_steps:
        return warm
    frac = min(1.0, max(0.0, (s - warmup_steps) / (total_steps - warmup_steps)))
    decay = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
    return warm * (min_lr_ratio + (1.0 - min_lr_ratio) * decay)


def build_engine(model: torch.nn.Module, *, lr: float, betas, weight_decay: float, grad_clip: float,
                 zero_stage: int, warmup_steps: int, micro_batch: int, grad_accum: int, bf16: bool,
                 lr_schedule: str = "constant", total_steps: int = 0, min_lr_ratio: float = 0.0):
    """Wrap the policy in a DeepSpeed engine with a torch AdamW (no extra op compile), linear warm-up and an
    optional decay (`lr_factor`)."""
    import deepspeed

    world = dist.get_world_size()
    trainable = [p for p in model.parameters() if p.requires_grad]  # all of them, or a LoRA adapter's
    optimizer = torch.optim.AdamW(trainable, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    if lr_schedule == "constant":  # today's lambda, kept as it was
        factor = lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0  # noqa: E731
    else:
        factor = functools.partial(lr_factor, warmup_steps=warmup_steps, schedule=lr_schedule,
                                   total_steps=total_steps, min_lr_ratio=min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
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
    engine.credo_optimizer_settings = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    return engine


def reapply_optimizer_settings(engine) -> None:
    """After a checkpoint load: the optimizer hyperparameters this engine was built with (the recipe's), not the
    checkpoint's. DeepSpeed restores the param groups' lr, betas and weight decay and the scheduler's base lr from
    the checkpoint, so a resume with an allowed change of optim.lr would otherwise train on at the old rate.
    Unchanged settings give back the same values (a plain resume stays bit-exact)."""
    settings = getattr(engine, "credo_optimizer_settings", None)
    if settings is None:
        return
    groups, sched = engine.optimizer.param_groups, engine.lr_scheduler
    for g in groups:
        g["initial_lr"], g["betas"], g["weight_decay"] = settings["lr"], settings["betas"], settings["weight_decay"]
    if sched is not None:
        sched.base_lrs = [settings["lr"]] * len(groups)
        for g, fn in zip(groups, sched.lr_lambdas):
            g["lr"] = settings["lr"] * fn(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in groups]


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum across ranks, returned on x's device (NCCL needs the GPU copy); a copy of x in a world of one."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return x.clone()
    y = x.to(device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y.to(x.device)


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Maximum across ranks, returned on x's device; a copy of x in a world of one."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return x.clone()
    y = x.to(device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    return y.to(x.device)


def rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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


def param_digests(module: torch.nn.Module) -> list[str]:
    """SHA-256 of this rank's parameters, gathered from every rank (data-parallel replicas must agree)."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # an FSDP2 shard: the whole parameter (collective)
        h.update(name.encode())
        h.update(full.detach().float().cpu().contiguous().numpy().tobytes())
    out = [h.hexdigest()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, h.hexdigest())
    return out


# ----------------------------------------------------------------------------- the policy engine's step
# DeepSpeed specifics of the update live here, so the update loop reads as backward / step.

def backward(engine, loss: torch.Tensor, world: int) -> None:
    """Backpropagate a loss already normalised by global token/sequence counts.

    No 1/grad_accum (the counts already cover the mini-batch) and undo DeepSpeed's data-parallel
    averaging (the counts already cover every rank).
    """
    engine.backward(loss * world, scale_wrt_gas=False)


def optimizer_step(engine, zero_stage: int) -> tuple[bool, float | None]:
    """`engine.step()` at every micro-batch (DeepSpeed applies it at the accumulation boundary).

    Returns (gradients finite, the gradient norm checked here: ZeRO-0 at a boundary, else None). On ZeRO-0
    DeepSpeed has no overflow check of its own: a non-finite norm is caught here and the step taken
    without an update.
    """
    norm = None
    if engine.is_gradient_accumulation_boundary() and zero_stage == 0:
        norm = grad_norm(engine.module)
        if not math.isfinite(norm):
            step_without_update(engine)
            return False, norm
    engine.step()
    return True, norm


def nan_loss(engine) -> torch.Tensor:
    """A loss whose backward poisons every gradient, so the step is skipped as a whole on every ZeRO stage."""
    return sum(p.sum() for p in engine.module.parameters() if p.requires_grad) * float("nan")


def step_without_update(engine) -> None:
    """`engine.step()` that moves no weight, optimizer moment or LR: DeepSpeed's overflow skip, for ZeRO-0.

    The gradients are dropped (torch optimizers pass over parameters without one), clipping is off for the
    call (it fails on no gradients), and the optimizer reports an overflow, so DeepSpeed counts a skipped
    step and holds the LR schedule as ZeRO-1/2/3 do, while its micro-step counters advance as usual.
    Touches DeepSpeed's `_config.gradient_clipping` and the optimizer's `overflow` flag: keep it here.
    """
    for p in engine.module.parameters():
        p.grad = None
    opt, cfg = engine.optimizer, engine._config
    clip, had, overflow = cfg.gradient_clipping, hasattr(opt, "overflow"), getattr(opt, "overflow", None)
    cfg.gradient_clipping, opt.overflow = 0.0, True
    try:
        engine.step()
    finally:
        cfg.gradient_clipping = clip
        if had:
            opt.overflow = overflow
        else:
            del opt.overflow


def grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def reported_grad_norm(engine, checked_norm: float) -> float:
    """DeepSpeed's global grad norm of the last step; None on ZeRO-0 with a torch optimizer: use the one checked."""
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else checked_norm


# ------------------------------------------------------------------------ in-memory engine state (rollback)
_ENGINE_COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


def engine_state_dict(engine) -> dict:
    """A detached copy of everything an optimizer step changes: weights, fp32 master partitions, optimizer
    moments, the LR schedule and DeepSpeed's step counters (ZeRO 0-2; ZeRO-3 partitions the weights).

    Checkpoints on disk use DeepSpeed's own format; this copy is for rolling back a step in memory.
    """
    if getattr(engine, "zero_optimization_stage", lambda: 0)() >= 3:
        raise NotImplementedError("in-memory rollback of a ZeRO-3 engine is not supported (its weights are "
                                  "partitioned); use engine.zero_stage <= 2")
    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)  # ZeRO-1/2 wrap the torch optimizer, which owns the moments
    state = {
        "module": {k: v.detach().clone() for k, v in engine.module.state_dict().items()},
        "optimizer": copy.deepcopy(base.state_dict()),
        "scheduler": copy.deepcopy(engine.lr_scheduler.state_dict()) if engine.lr_scheduler is not None else None,
        "counters": {a: getattr(engine, a) for a in _ENGINE_COUNTERS},
    }
    if hasattr(opt, "single_partition_of_fp32_groups"):
        state["fp32_partitions"] = [t.detach().clone() for t in opt.single_partition_of_fp32_groups]
    return state


def load_engine_state_dict(engine, state: dict) -> None:
    """Put an `engine_state_dict` copy back, bit for bit; gradients are dropped."""
    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)
    with torch.no_grad():
        live = engine.module.state_dict()
        for k, v in state["module"].items():
            live[k].copy_(v)
        for t, saved in zip(getattr(opt, "single_partition_of_fp32_groups", []), state.get("fp32_partitions", [])):
            t.copy_(saved)
    base.load_state_dict(copy.deepcopy(state["optimizer"]))
    if state["scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(state["scheduler"])
    for a, v in state["counters"].items():
        setattr(engine, a, v)
    engine.module.zero_grad(set_to_none=True)
