"""Push a trainer's weights into a running vLLM engine in place: no restart, no checkpoint on disk.

The path, trainer to engine:

1. :func:`full_state_dict` takes the trainer's HF state dict (unwrapping a DeepSpeed engine, DDP or
   ``torch.compile``; gathering ZeRO-3 partitions) and keeps one name per storage, so a tied
   ``lm_head.weight`` travels once, as ``model.embed_tokens.weight``.
2. :func:`push_weights` writes it as one safetensors file in ``/dev/shm`` (RAM, no disk) and sends the
   path through ``llm.collective_rpc`` to :meth:`WeightSyncExtension.credo_load_weights_file`, a method
   mixed into every vLLM worker through the engine argument ``worker_extension_cls`` (so no code is
   pickled and ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is not needed). Without room in ``/dev/shm`` it
   sends the safetensors bytes themselves through the RPC channel instead (slower: vLLM copies them
   through msgpack, ZeroMQ and its executor queue).
3. The worker reads the tensors in the trainer's (layer) order.
4. The worker calls ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)``,
   which copies into the engine's existing tensors (CUDA graphs and the KV cache stay valid), then
   :func:`refresh_tied_layers`.
5. :func:`push_weights` then resets vLLM's prefix cache (``llm.reset_prefix_cache()``): the cached KV
   blocks of a prompt were computed with the old weights and would otherwise be reused (measured: log-prob
   errors up to 3.6 for prompts longer than one KV block, 128 tokens on CPU).

Why tied embeddings need step 4's refresh. vLLM ties ``lm_head`` to ``embed_tokens`` by object
identity (``lm_head.weight = embed_tokens.weight``) and its loader skips the alias name
``lm_head.weight``. ``reload_weights`` reloads layer by layer: a layer that received weights is
re-materialised and re-runs ``quant_method.process_weights_after_loading``; a layer that received none
(the tied ``ParallelLMHead``) just gets its old tensor object back. The shared tensor itself does hold
the new values (the embedding layer wrote them), but on CPU ``process_weights_after_loading`` prepacks a
*copy* of the weight for the GEMM kernel (``layer.cpu_linear``, oneDNN or sgl-kernel packed), and the
logits are computed from that copy. So the tied head keeps computing logits with the old weights while
the input embedding uses the new ones: no error, silently wrong log-probs (differences up to ~2.4 nats
measured on the tiny model). Reloading from disk has the same flaw. The fix re-runs
``process_weights_after_loading`` on every layer whose parameters are all aliases of another layer's,
after the reload; on GPU that method is a no-op for unquantized layers, so the refresh costs nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

import torch

from credo.lora import policy_state_dict

WORKER_EXTENSION = "credo.distributed.weight_sync.WeightSyncExtension"
"""Qualified name to pass as vLLM's ``worker_extension_cls`` so workers accept weight pushes."""


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module inside a DeepSpeed engine, DDP/FSDP-style ``.module`` wrapper or ``torch.compile``."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
    return model


def is_zero3(model: torch.nn.Module) -> bool:
    """True when DeepSpeed ZeRO-3 partitions the parameters (each rank holds a shard, ``ds_id`` set)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def dedupe_tied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep the first name of every storage: a tied ``lm_head.weight`` is dropped after ``model.embed_tokens.weight``.

    vLLM loads one name per tied parameter (the first one its module traversal reaches, the embedding)
    and safetensors refuses to serialise two names sharing memory.
    """
    out, seen = {}, set()
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else None
        if key is not None and key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainer's full weights under their HF checkpoint names, tied aliases removed.

    Under DeepSpeed ZeRO-3 the parameters are gathered with ``deepspeed.zero.GatheredParameters``
    (all at once, so every rank briefly holds the full model in memory) and copied to CPU. That gather
    is a collective: **every rank must call this function at the same time**, including ranks that do
    not own a vLLM engine (they call it and drop the result). Stages 0-2 keep full parameters on every
    rank and need no gather. Under FSDP2 (a module its engine registered, `credo.distributed.engines.weights`) the
    DTensor blocks are gathered one tensor at a time into CPU copies, again a collective. A LoRA policy
    (`model.lora`) gives its merged weights (`credo.lora.policy_state_dict`).

    Args:
        model: an HF ``PreTrainedModel``, or a wrapper of one (DeepSpeed engine, DDP, ``torch.compile``).

    Returns:
        ``{name: tensor}`` detached (views of the live parameters except under ZeRO-3).
    """
    from credo.distributed.engines.weights import engine_of, full_weights

    if engine_of(model) is not None:  # FSDP2: the blocks' DTensor shards gathered bucket by bucket, copies on the CPU
        return full_weights(model)
    model = unwrap_model(model)
    if is_zero3(model):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            live = dedupe_tied({k: v.detach() for k, v in model.state_dict().items()})
            return {k: v.to("cpu", copy=True) for k, v in live.items()}
    return dedupe_tied(policy_state_dict(model))  # a LoRA policy's weights merged, under the base model's names


def cpu_contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def pack_state_dict(state: dict[str, torch.Tensor]) -> bytes:
    """Serialise a state dict to one safetensors byte string (tensors moved to CPU, made contiguous).

    safetensors stores tensors in its own order (by dtype and size), so send the names alongside when
    the order matters.
    """
    from safetensors.torch import save

    return save(cpu_contiguous(state))


def shm_dir(nbytes: int) -> str | None:
    """``/dev/shm`` when it exists and has room for ``nbytes`` (+10%), else None (Docker's default is 64 MB)."""
    if not os.path.isdir("/dev/shm"):
        return None
    return "/dev/shm" if shutil.disk_usage("/dev/shm").free > 1.1 * nbytes else None


def push_weights(llm, model: torch.nn.Module, *, transport: str = "auto", transform=None) -> float:
    """Copy ``model``'s weights into the running ``vllm.LLM`` in place; returns the seconds it took.

    The engine must have been built with ``worker_extension_cls=WORKER_EXTENSION``. Resets the prefix
    cache, whose KV blocks were computed with the old weights.

    Args:
        llm: the ``vllm.LLM``.
        model: the trainer's model (HF module, or a DeepSpeed engine / wrapper of one).
        transport: ``"shm"`` writes one safetensors file to ``/dev/shm`` (RAM) and sends its path; the
            worker reads it tensor by tensor. ``"bytes"`` sends the serialised weights through vLLM's RPC
            channel (msgpack over ZeroMQ, then the executor's queue), about 3x slower on a 90M-parameter
            model but needing no shared filesystem. ``"auto"``: ``shm`` when ``/dev/shm`` has room.
        transform: optional ``fn(state) -> state`` applied to the full state dict before it is sent (e.g.
            simulated FP8 quantisation, :func:`credo.distributed.rollout_copy.fp8_state`); the trainer's
            own tensors are not modified.

    Raises:
        RuntimeError: a worker loaded a different number of tensors than was sent.
    """
    if transport not in ("auto", "shm", "bytes"):
        raise ValueError(f"transport is {transport!r}, expected 'auto', 'shm' or 'bytes'")
    t0 = time.perf_counter()
    state = full_state_dict(model)
    if transform is not None:
        state = transform(state)
    names = list(state)
    folder = shm_dir(sum(t.numel() * t.element_size() for t in state.values()))
    if transport == "shm" and folder is None:
        raise RuntimeError("transport='shm' but /dev/shm is missing or too small for the weights; use 'bytes'")
    if transport == "bytes" or folder is None:
        loaded = llm.collective_rpc("credo_load_weights", args=(pack_state_dict(state), names))
    else:
        from safetensors.torch import save_file

        fd, path = tempfile.mkstemp(prefix="credo-weights-", suffix=".safetensors", dir=folder)
        os.close(fd)
        try:
            save_file(cpu_contiguous(state), path)
            loaded = llm.collective_rpc("credo_load_weights_file", args=(path, names))
        finally:
            os.unlink(path)
    if any(n != len(state) for n in loaded):
        raise RuntimeError(f"vLLM workers loaded {loaded} tensors, expected {len(state)} (the trainer's state dict)")
    llm.reset_prefix_cache()
    return time.perf_counter() - t0


def refresh_tied_layers(model: torch.nn.Module) -> list[str]:
    """Re-run ``process_weights_after_loading`` on layers whose parameters all alias another layer's.

    After an in-place reload these layers (vLLM's tied ``lm_head``) received no weights of their own,
    so any derived copy of the shared weight (the CPU prepacked GEMM weight) is stale; see the module
    docstring. Returns the names of the layers refreshed.
    """
    owner: dict[int, str] = {}
    refreshed = []
    for name, module in model.named_modules():
        params = list(module.named_parameters(recurse=False))
        aliases = [p for _, p in params if id(p) in owner]
        if params and len(aliases) == len(params) and getattr(module, "quant_method", None) is not None:
            module.quant_method.process_weights_after_loading(module)
            refreshed.append(name)
        for _, p in params:
            owner.setdefault(id(p), name)
    return refreshed


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryReloadFilter(logging.Filter):
    """Drops vLLM's '<...>RotaryEmbedding: Failed to load weights' warning, logged at every in-place reload.

    vLLM's rotary layer holds `cos_sin_cache`, a buffer computed from the config (rope_theta, positions),
    not a weight: a checkpoint has no tensor for it (HF's own `inv_freq` is not saved either). The layerwise
    reloader counts buffers among a layer's loadable tensors, sees that this layer received none, warns,
    and puts the layer's existing tensor back, which is the right one. Every other layer's warning passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.msg == "%s: Failed to load weights" and args and str(args[0]).endswith("RotaryEmbedding"))


def quiet_rotary_reload_warning() -> None:
    """Install `RotaryReloadFilter` on vLLM's reload logger (once per process)."""
    logger = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, RotaryReloadFilter) for f in logger.filters):
        logger.addFilter(RotaryReloadFilter())


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside the engine's worker process.

    ``names`` gives the trainer's order (layer by layer): vLLM buffers a layer's weights until the layer
    is complete, so loading in layer order keeps that buffer to about one layer.
    """

    def credo_load_weights(self, blob: bytes, names: list[str]) -> int:
        """Load a :func:`pack_state_dict` byte string into the model in place; returns the tensor count."""
        from safetensors.torch import load

        weights = load(blob)
        if sorted(names) != sorted(weights):
            raise ValueError(f"names lists {len(names)} tensors that do not match the {len(weights)} in blob")
        return self._credo_reload(((n, weights[n]) for n in names), len(names))

    def credo_load_weights_file(self, path: str, names: list[str]) -> int:
        """Load a safetensors file in place, one tensor in memory at a time; returns the tensor count."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if sorted(names) != sorted(f.keys()):
                raise ValueError(f"names lists {len(names)} tensors that do not match the {len(f.keys())} in {path}")
            return self._credo_reload(((n, f.get_tensor(n)) for n in names), len(names))

    def _credo_reload(self, weights, count: int) -> int:
        quiet_rotary_reload_warning()
        self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        refresh_tied_layers(self.model_runner.get_model())
        return count
