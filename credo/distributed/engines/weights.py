"""The policy's weights for a push to a rollout engine, gathered bucket by bucket from whichever engine trains it.

Every weight push (the hf backend's rollout copy at another precision, the vLLM engine's in-place reload, the Ray
pool's object-store push, overlap's shared-memory weight buffer) starts from a module: `engine.module`. Under
DeepSpeed ZeRO 0-2 that module holds the full parameters and the push reads them as they are
(`credo.distributed.weight_sync.full_state_dict`). Under FSDP2 each transformer block holds DTensor shards; the
engine registers itself here (`register`), and a push asks `weight_buckets(module)` for the full weights:

    for bucket in weight_buckets(module):        # collective under FSDP2: every rank iterates, in the same order
        for name, tensor in bucket:              # full CPU tensors, the names and dtypes DeepSpeed's push has
            ...

Each DTensor is gathered with `DTensor.full_tensor()` (an all-gather every rank joins), moved to the CPU at the
push dtype, and dropped from the device at once; a bucket is yielded once it holds `bucket_bytes`, so at most one
parameter's full tensor is alive on the device and, for a consumer that copies each bucket out (the rollout copy,
the weight buffer), at most one bucket of full tensors on the host. Ranks other than `dst` join the gathers and
get empty buckets. The names are the module's state-dict names with a tied alias kept once (as
`dedupe_tied` does); the dtype is the one the module computes in (bf16 under mixed precision, whose fp32 master
weights DeepSpeed's bf16 module does not push either).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

BUCKET_BYTES = 256 << 20
"""Host bytes per bucket of a gathered push (256 MiB: a few blocks of a 7B model)."""

_ENGINES: "weakref.WeakKeyDictionary[torch.nn.Module, object]" = weakref.WeakKeyDictionary()


def register(module: torch.nn.Module, engine) -> None:
    """`engine` (with `weight_buckets(bucket_bytes, dst)`) exports `module`'s weights (FSDP2: sharded blocks)."""
    _ENGINES[module] = engine


def engine_of(model: torch.nn.Module):
    """The engine registered for `model` (or the module inside a wrapper), or None (plain full parameters)."""
    from credo.distributed.weight_sync import unwrap_model

    for m in (model, unwrap_model(model)):
        try:
            if m in _ENGINES:
                return _ENGINES[m]
        except TypeError:  # not weak-referenceable
            pass
    return None


def is_sharded(model: torch.nn.Module) -> bool:
    """True when a registered engine must gather `model`'s weights (FSDP2's DTensor blocks)."""
    return engine_of(model) is not None


def weight_buckets(model: torch.nn.Module, *, bucket_bytes: int = BUCKET_BYTES,
                   dst: int | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The policy's full weights as buckets of (name, tensor): gathered by its registered engine (collective), or
    `weight_sync.full_state_dict(model)` cut into buckets in order (DeepSpeed: views of the live tensors; ZeRO-3:
    each bucket gathered, copied and released in turn, `weight_sync.zero3_buckets`), each closed once it holds
    `bucket_bytes`, as the gathered ones are."""
    engine = engine_of(model)
    if engine is not None:
        yield from engine.weight_buckets(bucket_bytes=bucket_bytes, dst=dst)
        return
    from credo.distributed.weight_sync import full_state_dict, is_zero3, unwrap_model, zero3_buckets

    if is_zero3(unwrap_model(model)):  # gathered bucket by bucket, never the whole model at once
        yield from zero3_buckets(model, bucket_bytes)
        return
    yield from split_buckets(full_state_dict(model).items(), bucket_bytes)


def split_buckets(items, bucket_bytes: int, nbytes=None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """(name, tensor) pairs in order, cut into buckets closed once they hold `bucket_bytes` (a tensor larger than
    that ends its bucket alone); no bucket is empty. `nbytes(tensor)`: a tensor's size (default: its own bytes;
    ZeRO-3 passes the full size of a partitioned parameter)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in items:
        bucket.append((name, t))
        size += nbytes(t) if nbytes is not None else t.numel() * t.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def gather_buckets(module: torch.nn.Module, *, dtype: torch.dtype | None, bucket_bytes: int = BUCKET_BYTES,
                   dst: int | None = None, rank: int = 0) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`module`'s state dict gathered tensor by tensor (the FSDP2 engine's `weight_buckets`; collective).

    Args:
        dtype: cast floating tensors to it on the way (None: as they are).
        dst: the rank that keeps the tensors (None: every rank); the others get empty buckets.
        rank: this process's rank.
    """
    from credo.lora import lora_layers

    keep = dst is None or dst == rank
    layers = lora_layers(module)
    state = module.state_dict()
    seen: set = set()
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in state.items():
        owner = _lora_owner(name, layers)
        if owner is not None and not name.startswith(owner + ".base_layer."):
            continue  # an adapter's own matrix (lora_A, lora_B): gathered and folded in with its base weight
        key = None if isinstance(t, DTensor) or not t.numel() else \
            (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key is not None and key in seen:  # a tied alias (lm_head.weight of a tied embedding): pushed once
            continue
        seen.add(key)
        out = _gathered(t, dtype, keep)
        if owner is not None:  # PEFT's `merge`: the base weight + (alpha / r) B A, under the base layer's name
            name = owner + "." + name[len(owner) + len(".base_layer."):]
            if name.endswith(".weight"):
                delta = _lora_delta(layers[owner], state, owner, dtype, keep)
                out = out + delta if keep else None
        if not keep:
            continue
        bucket.append((name, out))
        size += out.numel() * out.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket or not keep:
        yield bucket


def _gathered(t: torch.Tensor, dtype: torch.dtype | None, keep: bool) -> torch.Tensor | None:
    """`t` whole on the CPU at `dtype` (floating tensors), or None when this rank keeps nothing; a DTensor is
    all-gathered first, every rank joining (a world of one holds it whole: no collective)."""
    if isinstance(t, DTensor):
        full = t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()
    else:
        full = t
    if not keep:
        return None
    cast = dtype if dtype is not None and full.is_floating_point() else full.dtype
    return full.detach().to("cpu", cast, copy=True)  # the device's full tensor goes with `full`


def _lora_owner(key: str, layers: dict) -> str | None:
    from credo.lora import _owner

    return _owner(key, layers) if layers else None


def _lora_delta(layer, state: dict, owner: str, dtype: torch.dtype | None, keep: bool) -> torch.Tensor | None:
    """PEFT's `lora.Linear.get_delta_weight` on the gathered adapter matrices: (B @ A) (transposed for
    fan_in_fan_out) x scaling, in fp32 for a bf16/fp16 adapter on the CPU, then back to its dtype."""
    from peft.utils.other import transpose

    from credo.lora import ADAPTER

    a = _gathered(state[f"{owner}.lora_A.{ADAPTER}.weight"], dtype, keep)
    b = _gathered(state[f"{owner}.lora_B.{ADAPTER}.weight"], dtype, keep)
    if not keep:
        return None
    adapter_dtype = b.dtype
    low = adapter_dtype in (torch.float16, torch.bfloat16)
    if low:
        a, b = a.float(), b.float()
    out = transpose(b @ a, layer.fan_in_fan_out) * layer.scaling[ADAPTER]
    return out.to(adapter_dtype) if low else out


def full_weights(model: torch.nn.Module, *, dst: int | None = None) -> dict[str, torch.Tensor]:
    """Every bucket of `weight_buckets` in one dict (`full_state_dict`, the weight buffer's first fill)."""
    return {name: t for bucket in weight_buckets(model, dst=dst) for name, t in bucket}
