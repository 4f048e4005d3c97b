"""Push a trainer's weights into a running vLLM engine in place: no restart, no checkpoint on disk.

The path, trainer to engine:

1. The trainer's weights come bucket by bucket (`credo.distributed.engines.weights.weight_buckets`, about
   ``bucket_bytes`` each, 256 MiB by default): under FSDP2 each bucket is gathered from the DTensor shards as it
   is needed; under DeepSpeed ZeRO 0-2 the buckets are views of the live tensors (:func:`full_state_dict`, cut
   in order). Either way the names are the HF checkpoint names with a tied ``lm_head.weight`` sent once, as
   ``model.embed_tokens.weight``.
2. :func:`push_weights` opens one in-place reload on every vLLM worker (``credo_begin_reload``), then sends each
   bucket as one safetensors file in ``/dev/shm`` (RAM, no disk), its path through ``llm.collective_rpc`` to
   :meth:`WeightSyncExtension.credo_load_bucket_file`, a method mixed into every vLLM worker through the engine
   argument ``worker_extension_cls`` (so no code is pickled and ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is not
   needed). Without room in ``/dev/shm`` it sends the bucket's safetensors bytes themselves through the RPC
   channel instead (slower: vLLM copies them through msgpack, ZeroMQ and its executor queue). The bucket's
   tensors, its file and its bytes are dropped before the next bucket is gathered: the trainer's process holds
   at most one bucket of full tensors (and one serialised bucket) at a time.
3. The worker feeds each bucket, in the trainer's (layer) order, to the model's ``load_weights`` inside the one
   reload: vLLM's layerwise reload (``initialize_layerwise_reload`` at the start, ``finalize_layerwise_reload``
   at ``credo_end_reload``) buffers a layer's tensors until the layer is complete, also across buckets, and
   copies it into the engine's existing tensors (CUDA graphs and the KV cache stay valid). This is vLLM's own
   ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` with its iterator fed over
   several calls, so the weights vLLM ends up with are the ones a single call loads. Then
   :func:`refresh_tied_layers`.
4. :func:`push_weights` then resets vLLM's prefix cache (``llm.reset_prefix_cache()``): the cached KV
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
from collections.abc import Iterator

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


def zero3_buckets(model: torch.nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """ZeRO-3's full weights for a push, bucket by bucket: :func:`full_state_dict`'s names, order and values, but
    each bucket's parameters are gathered (``GatheredParameters``, a collective every rank joins, in the same order),
    copied to the CPU and released before the next bucket is gathered, so a rank holds at most one bucket of full
    parameters (plus its own shards), not the whole model. Buckets close once they hold `bucket_bytes` (sizes from
    the full shapes, ``ds_shape``), as :func:`credo.distributed.engines.weights.split_buckets` closes them; 0: one
    bucket, the whole model gathered at once as before."""
    import deepspeed

    model = unwrap_model(model)
    entries, seen = [], set()
    for name, t in model.state_dict(keep_vars=True).items():  # keep_vars: the Parameters, so a tied one is one object
        key = id(t) if isinstance(t, torch.nn.Parameter) else None
        if key is not None and key in seen:
            continue  # a tied alias (lm_head.weight after embed_tokens.weight), dropped as dedupe_tied drops it
        seen.add(key)
        entries.append((name, t))

    from credo.distributed.engines.weights import split_buckets

    def full_nbytes(t: torch.Tensor) -> int:  # a partitioned parameter's own numel is its shard's
        return (t.ds_numel if hasattr(t, "ds_numel") else t.numel()) * t.element_size()

    for group in split_buckets(entries, bucket_bytes or 1 << 62, nbytes=full_nbytes):
        params = [x for _, x in group if hasattr(x, "ds_id")]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            bucket = [(n, x.detach().to("cpu", copy=True)) for n, x in group]
        yield bucket  # the gather is released before the consumer sees the bucket


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


def push_weights(llm, model: torch.nn.Module, *, transport: str = "auto", transform=None,
                 bucket_bytes: int | None = None) -> float:
    """Copy ``model``'s weights into the running ``vllm.LLM`` in place, bucket by bucket; returns the seconds it took.

    The engine must have been built with ``worker_extension_cls=WORKER_EXTENSION``. Resets the prefix
    cache, whose KV blocks were computed with the old weights. Under FSDP2 (or ZeRO-3) the gathers are
    collectives: every rank must call this at the same time.

    Args:
        llm: the ``vllm.LLM`` (or anything with its ``collective_rpc`` and ``reset_prefix_cache``).
        model: the trainer's model (HF module, or a DeepSpeed engine / wrapper of one, or FSDP2's sharded module).
        transport: ``"shm"`` writes each bucket as a safetensors file to ``/dev/shm`` (RAM) and sends its path;
            the worker reads it tensor by tensor. ``"bytes"`` sends each serialised bucket through vLLM's RPC
            channel (msgpack over ZeroMQ, then the executor's queue), about 3x slower on a 90M-parameter
            model but needing no shared filesystem. ``"auto"``: ``shm`` when ``/dev/shm`` has room for a bucket.
        transform: optional ``fn(state) -> state`` applied to each bucket (a dict, in order) before it is sent (e.g.
            simulated FP8 quantisation, :func:`credo.distributed.rollout_copy.fp8_state`, tensor by tensor); the
            trainer's own tensors are not modified.
        bucket_bytes: bytes of full tensors per bucket (None: `credo.distributed.engines.weights.BUCKET_BYTES`); a
            bucket closes once it holds this many, so a tensor larger than it is a bucket of its own.

    Raises:
        RuntimeError: a worker loaded a different number of tensors than was sent.
    """
    from credo.distributed.engines.weights import BUCKET_BYTES, weight_buckets

    if transport not in ("auto", "shm", "bytes"):
        raise ValueError(f"transport is {transport!r}, expected 'auto', 'shm' or 'bytes'")
    t0 = time.perf_counter()
    sent = 0
    llm.collective_rpc("credo_begin_reload")
    try:
        for bucket in weight_buckets(model, bucket_bytes=bucket_bytes or BUCKET_BYTES):
            state = dict(bucket)
            del bucket  # only `state` holds the bucket now: dropped below, before the next one is gathered
            if transform is not None:
                state = transform(state)
            loaded = _send_bucket(llm, state, transport)
            if any(n != len(state) for n in loaded):
                raise RuntimeError(f"vLLM workers loaded {loaded} tensors of a bucket of {len(state)}")
            sent += len(state)
            del state
    finally:
        totals = llm.collective_rpc("credo_end_reload")  # also after an error: the layers go back to their tensors
    if any(n != sent for n in totals):
        raise RuntimeError(f"vLLM workers loaded {totals} tensors, expected {sent} (the trainer's state dict)")
    llm.reset_prefix_cache()
    return time.perf_counter() - t0


def _send_bucket(llm, state: dict[str, torch.Tensor], transport: str) -> list[int]:
    """One bucket to every worker of the open reload: a safetensors file in /dev/shm, or its bytes; the counts."""
    names = list(state)
    folder = shm_dir(sum(t.numel() * t.element_size() for t in state.values()))
    if transport == "shm" and folder is None:
        raise RuntimeError("transport='shm' but /dev/shm is missing or too small for a bucket of the weights; "
                           "use 'bytes'")
    if transport == "bytes" or folder is None:
        return llm.collective_rpc("credo_load_bucket", args=(pack_state_dict(state), names))
    from safetensors.torch import save_file

    fd, path = tempfile.mkstemp(prefix="credo-weights-", suffix=".safetensors", dir=folder)
    os.close(fd)
    try:
        save_file(cpu_contiguous(state), path)
        return llm.collective_rpc("credo_load_bucket_file", args=(path, names))
    finally:
        os.unlink(path)


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

    A push is ``credo_begin_reload``, one ``credo_load_bucket`` / ``credo_load_bucket_file`` per bucket, then
    ``credo_end_reload``: vLLM's in-place ``reload_weights`` with its weights iterator fed over several calls.
    ``names`` gives the trainer's order (layer by layer): vLLM buffers a layer's weights until the layer
    is complete (also across buckets), so loading in layer order keeps that buffer to about one layer.
    """

    def credo_begin_reload(self) -> None:
        """Start an in-place reload (vLLM's `initialize_layerwise_reload`): every layer waits for its weights."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        quiet_rotary_reload_warning()
        initialize_layerwise_reload(self.model_runner.get_model())
        self._credo_loaded = 0

    def credo_load_bucket(self, blob: bytes, names: list[str]) -> int:
        """Load a :func:`pack_state_dict` byte string (one bucket) into the open reload; returns its tensor count."""
        from safetensors.torch import load

        weights = load(blob)
        if sorted(names) != sorted(weights):
            raise ValueError(f"names lists {len(names)} tensors that do not match the {len(weights)} in blob")
        return self._credo_load(((n, weights[n]) for n in names), len(names))

    def credo_load_bucket_file(self, path: str, names: list[str]) -> int:
        """Load a safetensors file (one bucket) into the open reload, one tensor read at a time; its tensor count."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if sorted(names) != sorted(f.keys()):
                raise ValueError(f"names lists {len(names)} tensors that do not match the {len(f.keys())} in {path}")
            return self._credo_load(((n, f.get_tensor(n)) for n in names), len(names))

    def _credo_load(self, weights, count: int) -> int:
        if not hasattr(self, "_credo_loaded"):
            raise RuntimeError("a weight bucket reached a vLLM worker with no reload open (credo_begin_reload)")
        self.model_runner.get_model().load_weights(weights)
        self._credo_loaded += count
        return count

    def credo_weights_digest(self) -> dict[str, str]:
        """sha256 of each of the engine's parameters and buffers (its own names and layout): equal digests, the
        same weights in vLLM (tests compare pushes with it)."""
        import hashlib

        out = {}
        model = self.model_runner.get_model()
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t = t.detach().cpu().contiguous()
            out[name] = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        return out

    def credo_end_reload(self) -> int:
        """Close the reload (vLLM's `finalize_layerwise_reload`, then the runner's cache resets that its
        `reload_weights` does), refresh the tied layers; returns the tensors loaded since `credo_begin_reload`."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        model = runner.get_model()
        finalize_layerwise_reload(model, runner.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            if hasattr(runner, reset):
                getattr(runner, reset)()
        refresh_tied_layers(model)
        loaded = getattr(self, "_credo_loaded", 0)
        if hasattr(self, "_credo_loaded"):
            del self._credo_loaded
        return loaded
