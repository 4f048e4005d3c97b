"""A double buffer of policy weights in shared memory: the trainer publishes a version while rollout workers generate.

    slot 0, slot 1        two copies of the model's parameters, in shared memory
    versions[2]           the policy version each slot holds (-1: none yet, -2: being written)
    readers[2]            workers copying out of each slot right now

`publish(model, version)` (the trainer) writes the slot that does not hold the newest version, then stamps it; it
waits only while a worker is still copying that older slot out (a model copy, milliseconds), never for a
generation. `take(model, have)` (a worker, between two requests) copies the newest slot into the worker's own model
when it is newer than `have`. So generation never stops for a weight update, and a worker never reads a slot being
written: a reader picks only stamped slots, and the writer never touches the newest one, nor one with a reader.
Under FSDP2 (`credo.distributed.engines.weights`) the trainer's blocks are DTensor shards: `publish` has the engine
gather them bucket by bucket into the slot.
"""

from __future__ import annotations

import time

import torch

from credo.distributed.engines.weights import full_weights, is_sharded, weight_buckets

WRITING = -2


class WeightBuffers:
    """Two shared-memory copies of `model`'s parameters (named as `model.named_parameters()` lists them).

    `ctx` is the multiprocessing context whose processes share it (passed to them at their start)."""

    def __init__(self, model: torch.nn.Module, ctx):
        self.names = [name for name, _ in model.named_parameters()]
        self.sharded = is_sharded(model)
        full = full_weights(model) if self.sharded else dict(model.named_parameters())  # FSDP2: gathered (collective)
        self.slots = [[full[n].detach().to("cpu", copy=True).share_memory_() for n in self.names] for _ in range(2)]
        self.versions = ctx.Array("q", [-1, -1], lock=False)
        self.readers = ctx.Array("i", [0, 0], lock=False)
        self.lock = ctx.Lock()

    def newest(self) -> int:
        """The newest published version (-1: none yet)."""
        with self.lock:
            return max(self.versions[0], self.versions[1])

    @torch.no_grad()
    def publish(self, model: torch.nn.Module, version: int, *, timeout_s: float) -> None:
        """Write `model`'s parameters as `version` into the older slot (waiting, up to `timeout_s`, for a worker
        still copying it out), then stamp it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                target = 0 if self.versions[0] <= self.versions[1] else 1
                if self.readers[target] == 0:
                    self.versions[target] = WRITING
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"a rollout worker has been copying weight slot {target} for over {timeout_s} s")
            time.sleep(0.001)
        if self.sharded:
            self._write_gathered(model, target)
        else:
            params = [p for _, p in model.named_parameters()]
            if len(params) != len(self.names):
                raise ValueError(f"the model has {len(params)} parameters, the weight buffers {len(self.names)}")
            for dst, src in zip(self.slots[target], params):
                dst.copy_(src.detach())
        with self.lock:
            self.versions[target] = version

    def _write_gathered(self, model: torch.nn.Module, target: int) -> None:
        """FSDP2: the engine gathers the blocks bucket by bucket; each bucket is copied into the slot and dropped."""
        index = {n: i for i, n in enumerate(self.names)}
        written = set()
        for bucket in weight_buckets(model):
            for name, t in bucket:
                if name in index:  # a persistent buffer of the state dict has no slot (the slots hold parameters)
                    self.slots[target][index[name]].copy_(t)
                    written.add(name)
        if len(written) != len(self.names):
            raise ValueError(f"the trainer's weights left slots {sorted(set(self.names) - written)} unwritten")

    @torch.no_grad()
    def take(self, model: torch.nn.Module, have: int) -> int:
        """Copy the newest published slot into `model` if it is newer than version `have`; the version it now holds."""
        with self.lock:
            slot = 0 if self.versions[0] >= self.versions[1] else 1
            version = self.versions[slot]
            if version <= have:
                return have
            self.readers[slot] += 1
        try:
            for dst, src in zip((p for _, p in model.named_parameters()), self.slots[slot]):
                dst.copy_(src)
        finally:
            with self.lock:
                self.readers[slot] -= 1
        return version
