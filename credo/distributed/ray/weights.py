"""Weight pushes to rollout workers through the Ray object store: full, or a sparse delta of what changed.

In the rollout dtype most weights do not change in one RL step: an update smaller than half a unit in the last
place rounds back to the same bf16 value (ROSE's weight sparsity, measured in docs/cluster.md). `diff_state`
compares the new weights with the last pushed ones bit for bit and sends, per tensor, the new values of the changed
elements with where they are, as flat int32 indices (few changes) or a bitmask of one bit per element (many), or
the whole tensor: whichever is smallest. `apply_delta` writes them in place.
Unchanged elements are bitwise equal by construction, so a worker's weights after a delta push are bitwise those
of a full push (tests/ray/test_ray_rollout.py checks it with `state_digest`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from credo.distributed.engines.weights import BUCKET_BYTES, weight_buckets

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def wire_state(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """A copy of the trainer's weights as they travel: HF names (tied aliases once), on the CPU, cast to `dtype`
    (None: as they are), contiguous. Under ZeRO-3 or FSDP2 this gathers, a collective every rank must join."""
    return {k: v for bucket in wire_buckets(model, dtype, BUCKET_BYTES) for k, v in bucket.items()}


def wire_buckets(model: torch.nn.Module, dtype: torch.dtype | None, bucket_bytes: int):
    """`wire_state` bucket by bucket (`credo.distributed.engines.weights.weight_buckets`: FSDP2 gathers each bucket
    as it is asked for, DeepSpeed's views are cut in order): dicts of copies, about `bucket_bytes` of the trainer's
    tensors each, so a push that drops each bucket before asking for the next holds one at a time."""
    for bucket in weight_buckets(model, bucket_bytes=bucket_bytes):
        # views of the live parameters (DeepSpeed) are copied, so a later diff sees the change
        out = {k: v.detach().to("cpu", dtype or v.dtype, copy=True).contiguous() for k, v in bucket}
        del bucket
        yield out


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@dataclass
class Delta:
    dense: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors sent whole: new names, new shapes, or changed in so many places that indices would cost more."""
    sparse: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """name -> (flat indices [K] int32/int64, new values [K]) of the changed elements."""
    masked: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """name -> (bitmask [ceil(N / 8)] uint8 of the changed elements, numpy.packbits order; new values [K])."""
    changed: int = 0
    """Elements whose bits changed."""
    total: int = 0
    """Elements in the model."""
    full_bytes: int = 0
    """Bytes of a full push."""
    sent_bytes: int = 0
    """Bytes of this delta (indices + values + dense tensors)."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(_BITS[t.element_size()])


def diff_state(last: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> Delta:
    """What changed from `last` to `new` (same names, CPU tensors of one dtype each), bit for bit."""
    d = Delta(total=sum(t.numel() for t in new.values()), full_bytes=nbytes(new))
    for name, t in new.items():
        old = last.get(name)
        size = t.element_size()
        if old is None or old.shape != t.shape or old.dtype != t.dtype:
            d.dense[name] = t
            d.changed += t.numel()
            d.sent_bytes += t.numel() * size
            continue
        changed = _bits(t) != _bits(old)
        idx = changed.nonzero()[:, 0]
        k = idx.numel()
        if not k:
            continue
        d.changed += k
        idx = idx.int() if t.numel() < 2**31 else idx
        costs = {"dense": t.numel() * size, "sparse": k * (size + idx.element_size()), "masked": -(-t.numel() // 8) + k * size}
        kind = min(costs, key=costs.get)
        d.sent_bytes += costs[kind]
        if kind == "dense":
            d.dense[name] = t
        elif kind == "sparse":
            d.sparse[name] = (idx, t.reshape(-1)[idx.long()].clone())
        else:
            d.masked[name] = (torch.from_numpy(np.packbits(changed.numpy())), t.reshape(-1)[changed].clone())
    return d


@torch.no_grad()
def apply_delta(target: dict[str, torch.Tensor], delta: Delta) -> None:
    """Write `delta` into `target`'s tensors in place (a module's `state_dict(keep_vars=True)`: tied names share one)."""
    for name, t in delta.dense.items():
        _target(target, name, t.dtype).copy_(t)
    for name, (idx, values) in delta.sparse.items():
        _target(target, name, values.dtype).view(-1)[idx.long()] = values
    for name, (mask, values) in delta.masked.items():
        flat = _target(target, name, values.dtype).view(-1)
        flat[torch.from_numpy(np.unpackbits(mask.numpy(), count=flat.numel()).astype(bool))] = values


def _target(target: dict[str, torch.Tensor], name: str, dtype: torch.dtype) -> torch.Tensor:
    if name not in target:
        raise KeyError(f"weight push names '{name}', which the rollout worker's model does not have")
    t = target[name]
    if t.dtype != dtype:
        raise TypeError(f"weight push sends '{name}' as {dtype}, the rollout worker holds it as {t.dtype}")
    return t.data


@torch.no_grad()
def load_full(target: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Copy every tensor of `state` into `target` in place (dtypes must match: the wire dtype is the worker's)."""
    for name, t in state.items():
        _target(target, name, t.dtype).copy_(t)


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names and raw bytes, in name order: equal digests mean bitwise equal weights."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(_bits(t).numpy().tobytes())
    return h.hexdigest()
