"""Atomic, verifiable checkpoints of the full trainer state, and resume from the newest good one.

A checkpoint folder `checkpoints/step_<N>/` holds DeepSpeed's own checkpoint (policy + optimizer, and
the LR scheduler), each rank's RNG states (python, numpy, torch), and `meta.json` with the step, the
data position, the SFT-cache key and a manifest of every file with its size and SHA-256. It is
written to `.tmp-step_<N>`, fsynced, then renamed, so a kill mid-write leaves only a temp folder that
resume ignores. On resume, a folder whose manifest does not match is reported and skipped in favour
of the previous good one (and renamed `corrupt-step_<N>`, so later resumes and `keep_last` pruning
no longer count it). A model holding NaN/Inf is never written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from credo.distributed.engine import all_reduce_sum, barrier
from credo.distributed.engines import as_train_engine
from credo.safe_load import load as safe_load
from credo.safe_load import weights_only_torch_load

log = logging.getLogger("credo.checkpoint")
TAG = "state"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rng_state() -> dict:
    """Every global RNG a step may draw from: python, numpy, torch (CPU) and torch.cuda (each device), as tensors,
    lists and numbers only, so that it loads weights-only (credo.safe_load)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return rng_state_to_plain(state)


def rng_state_to_plain(state: dict) -> dict:
    """The python and numpy states of `state` as lists and numbers (random.getstate()'s tuple holds ints only;
    numpy's holds a uint32 array)."""
    out = dict(state)
    if isinstance(state["python"], tuple):
        version, internal, gauss = state["python"]
        out["python"] = {"version": version, "state": list(internal), "gauss": gauss}
    if isinstance(state["numpy"], tuple):
        name, keys, pos, has_gauss, cached = state["numpy"]
        out["numpy"] = {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def set_rng_state(state: dict) -> None:
    state = rng_state_to_plain(state)
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    np.random.set_state((npy["name"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def params_finite(module: torch.nn.Module) -> str | None:
    """Name of the first parameter holding NaN/Inf, or None."""
    for name, p in module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 shard: this rank's part
        if not torch.isfinite(local.detach()).all():
            return name
    return None


def save_checkpoint(engine, ckpt_root: Path, step: int, *, meta: dict, keep_last: int,
                    extra_save: Callable[[Path], dict] | None = None) -> Path | None:
    """Collective: every rank calls it. Returns the final folder (rank 0), or None when refused.

    `extra_save(tmp_folder)`, called on every rank after the engine is written, may add files of its own
    (e.g. the critics' engines); they are covered by the manifest, and the dict it returns (rank 0's) is
    merged into meta.json.
    """
    rank = dist.get_rank()
    engine = as_train_engine(engine)
    bad = params_finite(engine.module)
    if all_reduce_sum(torch.tensor([1 if bad else 0])).item():
        log.error("not writing checkpoint at step %d: parameter %s is not finite", step, bad or "(on another rank)")
        return None
    final = ckpt_root / f"step_{step:08d}"
    tmp = ckpt_root / f".tmp-step_{step:08d}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    engine.save_checkpoint(tmp)  # the engine's own format: DeepSpeed's under state/, FSDP2's DCP under dcp/
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    if extra_save is not None:
        meta = {**meta, **(extra_save(tmp) or {})}
    barrier()
    if rank == 0:
        manifest = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                    for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "manifest": manifest}, indent=1))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fd = os.open(ckpt_root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        for old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Completed checkpoint folders, oldest first (temp folders excluded)."""
    if not ckpt_root.exists():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def verify_checkpoint(path: Path) -> str | None:
    """None if the folder matches its manifest, else what is wrong."""
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        return "meta.json is missing (partial write)"
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        return f"meta.json is corrupt ({e})"
    if not meta.get("manifest"):
        return "meta.json lists no files (expected a manifest of the checkpoint's files)"
    for rel, info in meta["manifest"].items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != info["size"]:
            return f"{rel} has size {f.stat().st_size}, expected {info['size']}"
        if _sha256(f) != info["sha256"]:
            return f"{rel} does not match its checksum"
    return None


def find_resume_checkpoint(ckpt_root: Path, *, tidy: bool = False) -> Path | None:
    """The newest checkpoint that verifies; corrupt ones are reported and skipped.

    With `tidy` (one process only, e.g. rank 0 before broadcasting the answer), the skipped folders are
    renamed `corrupt-step_<N>` (kept for inspection, no longer listed) and temp folders of interrupted
    writes are removed.
    """
    if tidy and ckpt_root.exists():
        for tmp in ckpt_root.glob(".tmp-step_*"):
            log.warning("removing %s: a checkpoint write that was interrupted", tmp)
            shutil.rmtree(tmp, ignore_errors=True)
    for path in reversed(list_checkpoints(ckpt_root)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s; trying the previous one", path, problem)
        if tidy:
            aside = path.with_name("corrupt-" + path.name)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(path, aside)
            log.warning("renamed the corrupt checkpoint to %s", aside)
    return None


def load_checkpoint(engine, path: Path, *, verify: bool = True) -> dict:
    """Restore engine (policy, optimizer, scheduler) and this rank's RNG; return meta.json.

    Every file is unpickled weights-only (credo.safe_load): one that names code outside the allow-list raises
    `UnsafeFileError` naming it, and nothing of it runs (the manifest alone cannot tell: whoever planted a file can
    rewrite meta.json too).
    `verify=False` skips the checksum pass when the caller has just verified `path`.
    """
    problem = verify_checkpoint(path) if verify else None
    if problem is not None:
        raise RuntimeError(f"checkpoint {path} is not usable: {problem}")
    with weights_only_torch_load():  # DeepSpeed's own loader unpickles with weights_only=False
        as_train_engine(engine).load_checkpoint(path)  # and the recipe's lr, betas, weight decay (a resume may change them)
    rng_file = path / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.exists():
        set_rng_state(safe_load(rng_file))
    else:  # resumed on more ranks than it was saved from: sampling is seeded per step, but exactness is not promised
        log.warning("checkpoint %s has no RNG state for rank %d; this rank keeps its fresh RNG", path, dist.get_rank())
    return json.loads((path / "meta.json").read_text())
