"""Weight pushes by a collective broadcast from the trainer to its rollout workers (`cluster.sync_transport`).

verl and OpenRLHF push a GPU trainer's weights to GPU rollout engines with an NCCL broadcast in a process group of
their own (trainer rank 0 + the engines), not through the Ray object store: the bytes go device to device, once
per worker, with no copy through host memory. credo does the same, with one group per pool:

    group = open_group("gloo", host, port, rank, world, timeout_s)   # on the trainer (rank 0) and each worker
    broadcast_state(group, state)                                     # rank 0: the wire state
    state = receive_state(group, layout)                              # ranks 1..: tensors like the sender's

- The group is a private `ProcessGroupGloo`/`ProcessGroupNCCL` over its own `TCPStore` (the trainer is the store's
  master), built directly rather than through `torch.distributed.init_process_group`: the trainer's ranks already
  have their default group (DeepSpeed's), which neither joins nor disturbs this one.
- `nccl` moves CUDA tensors between GPUs; `gloo` moves CPU tensors over TCP. The two run the same code, so `gloo`
  is the collective path on CPU workers and is what the tests run (this machine has no GPU).
- Tensors travel in buckets: each bucket is one flat buffer of one dtype, of at most `bucket_bytes` (a tensor
  larger than that is a bucket of its own), so a push is a few large broadcasts rather than one per tensor, and
  the extra memory on either side is one bucket. Bytes are copied as they are: the received weights are bitwise
  the sender's.
- A broadcast is dense: a sparse delta (`cluster.sync: delta`) goes through the object store only.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch

BUCKET_BYTES = 256 << 20
"""Largest flat buffer of one broadcast (a larger tensor is sent alone)."""

BACKENDS = ("gloo", "nccl")


@dataclass
class Group:
    """A private process group: its store (kept alive with it), the backend's group, the device of its tensors."""

    store: object
    pg: object
    backend: str
    rank: int
    world: int
    device: torch.device


def open_group(backend: str, host: str, port: int, rank: int, world: int, timeout_s: float, *,
               store=None) -> Group:
    """Join (rank > 0) or create (rank 0) the group `world` processes form over the TCPStore at host:port; blocks
    until every rank has joined or `timeout_s` passed. Rank 0 may pass the master `store` it made (`master_store`)."""
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ValueError(f"collective backend is {backend!r}, expected one of {BACKENDS}")
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, world, timeout)
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            raise RuntimeError("cluster.sync_transport = 'nccl' but this process sees no CUDA device")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world, opts)
        device = torch.device("cuda", torch.cuda.current_device())
    return Group(store=store, pg=pg, backend=backend, rank=rank, world=world, device=device)


def master_store(host: str, world: int, timeout_s: float):
    """The group's TCPStore on rank 0, on a free port (`store.port`), not waiting for the others to connect."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def layout_of(state: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype name) per tensor, in the state's order: what a receiver needs to rebuild it."""
    return [(k, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in state.items()]


def buckets(layout: list[tuple[str, tuple[int, ...], str]], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices into `layout`, grouped into buckets of one dtype and at most `bucket_bytes` each (in layout order
    within a dtype, dtypes in order of first appearance), so both sides cut the same buffers."""
    by_dtype: dict[str, list[int]] = {}
    for i, (_, _, dt) in enumerate(layout):
        by_dtype.setdefault(dt, []).append(i)
    out: list[list[int]] = []
    for dt, idx in by_dtype.items():
        size = torch.empty((), dtype=getattr(torch, dt)).element_size()
        cur, cur_bytes = [], 0
        for i in idx:
            n = _numel(layout[i][1]) * size
            if cur and cur_bytes + n > bucket_bytes:
                out.append(cur)
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += n
        if cur:
            out.append(cur)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def broadcast_state(group: Group, state: dict[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> int:
    """Rank 0: send `state` (its tensors on any device) to every other rank; the bytes sent to each."""
    if group.rank != 0:
        raise ValueError(f"broadcast_state runs on rank 0, this is rank {group.rank}")
    tensors = list(state.values())
    sent = 0
    for bucket in buckets(layout_of(state), bucket_bytes):
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in bucket]).to(group.device)
        group.pg.broadcast(flat, 0).wait()
        sent += flat.numel() * flat.element_size()
    return sent


def receive_state(group: Group, layout: list[tuple[str, tuple[int, ...], str]],
                  bucket_bytes: int = BUCKET_BYTES) -> dict[str, torch.Tensor]:
    """Ranks 1..: the tensors rank 0 sends with `broadcast_state` of a state whose `layout_of` is `layout`, on the
    group's device (views of the received buffers, to be copied into the worker's model)."""
    parts: dict[int, torch.Tensor] = {}
    for bucket in buckets(layout, bucket_bytes):
        dtype = getattr(torch, layout[bucket[0]][2])
        sizes = [_numel(layout[i][1]) for i in bucket]
        flat = torch.empty(sum(sizes), dtype=dtype, device=group.device)
        group.pg.broadcast(flat, 0).wait()
        for i, part in zip(bucket, flat.split(sizes)):
            parts[i] = part.view(layout[i][1])
    return {name: parts[i] for i, (name, _, _) in enumerate(layout)}
