"""The rollout (or judge) worker that runs inside a Ray actor: a model loaded from a folder behind an hf or vllm backend.

The worker holds a host module loaded from the policy folder and the backend that samples from it. Weight pushes
write into `target`, the tensors the backend samples from in the wire dtype (see `RayRolloutBackend`):

- hf, no dtype: the host module itself (the backend samples from it, as the local backend samples the trainer's);
- hf with rollout dtype: the backend's lower-precision copy (built from the host as the local backend builds it
  from the trainer's module, so the bits match a local run);
- fp8 weights, or vllm: the host module; the backend then re-quantises from it or pushes it into the engine.
"""

from __future__ import annotations

import os

import torch

from credo.distributed.ray.weights import Delta, apply_delta, load_full, state_digest
from credo.distributed.rollout import HFBackend, Sample
from credo.distributed.weight_sync import full_state_dict


class RolloutWorker:
    """One rollout worker (made a Ray actor by `WorkerGroup`).

    Args:
        model_path: a local Hugging Face model folder with its tokenizer (the policy's, or the judge's).
        engine: 'hf' or 'vllm'.
        model_dtype: the trainer's dtype, in which the host module is loaded.
        dtype: the rollout dtype (None: the trainer's), as `HFBackend`'s and `VLLMBackend`'s `dtype`.
        fp8_weights, max_batch, per_sample_seeds: as `HFBackend` (fp8_weights also for vllm).
        threads: torch intra-op threads in this worker.
        vllm_kwargs: passed on to `VLLMBackend`.
        prompt_embeds: vllm: the engine takes prompt embeddings (soft prefixes, computed with the host's live input
            embeddings); hf takes them without it.
    """

    def __init__(self, model_path: str, *, engine: str = "hf", model_dtype: str = "float32", dtype: str | None = None,
                 fp8_weights: bool = False, max_batch: int = 0, per_sample_seeds: bool = True, threads: int = 1,
                 vllm_kwargs: dict | None = None, prompt_embeds: bool = False):
        from credo.models import load_causal_lm, load_tokenizer

        torch.set_num_threads(threads)
        tokenizer = load_tokenizer(model_path)
        host_dtype = dtype if engine == "vllm" and dtype and not fp8_weights else model_dtype
        # requires_grad stays on, as on the trainer's module the local backend samples from: with it off, generate's
        # log-probs differed in the last bits (3.8e-6 on 1 of the quickstart's 512 samples; a plain forward did not)
        self.host = load_causal_lm(model_path, host_dtype).eval()
        self.fp8_weights = fp8_weights
        if engine == "hf":
            self.backend = HFBackend(self.host, tokenizer, max_batch=max_batch, dtype=dtype, fp8_weights=fp8_weights,
                                     per_sample_seeds=per_sample_seeds)
            copy = self.backend.copy
            pushed = copy.module if copy is not None and not fp8_weights else self.host
        elif engine == "vllm":
            from credo.distributed.vllm_backend import VLLMBackend

            self.backend = VLLMBackend(model_path, dtype=dtype or model_dtype, fp8_weights=fp8_weights,
                                       input_embeddings=self.host.get_input_embeddings() if prompt_embeds else None,
                                       **(vllm_kwargs or {}))
            if fp8_weights:  # the engine loaded full-precision weights: quantise them, as the local builder does
                self.backend.sync_weights(self.host, 0)
            pushed = self.host
        else:
            raise ValueError(f"engine is {engine!r}, expected 'hf' or 'vllm'")
        self.engine = engine
        self.target = pushed.state_dict(keep_vars=True)
        self.pushed = pushed
        self.group = None  # the collective group of cluster.sync_transport gloo/nccl, once joined

    def ready(self) -> dict:
        """Where this worker runs: node id, process id, torch threads."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "threads": torch.get_num_threads()}

    def generate(self, prompts: list[list[int]], seeds: list[int] | None, kwargs: dict) -> list[Sample]:
        return self.backend.generate(prompts, seeds=seeds, **kwargs)

    def generate_race(self, prompts: list[list[int]], groups: list[int], seeds: list[int] | None, kwargs: dict):
        """Tail batching's race (`credo.distributed.race`) on this worker's backend: a `RaceResult`."""
        return self.backend.generate_race(prompts, groups, seeds=seeds, **kwargs)

    def load_part(self, payload: tuple) -> None:
        """Apply one bucket of a weight push: ('full', tensors) or ('delta', Delta); `loaded` ends the push."""
        kind, data = payload
        if kind == "full":
            load_full(self.target, data)
        elif isinstance(data, Delta):
            apply_delta(self.target, data)
        else:
            raise ValueError(f"weight push of kind {kind!r}, expected 'full' or 'delta'")

    def join_group(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        """Join the trainer's collective group for weight pushes (a new one each time the pool's membership changes:
        the old one, which may hold a dead peer, is dropped first)."""
        from credo.distributed.ray.collective import open_group

        self.group = None
        self.group = open_group(backend, host, port, rank, world, timeout_s)

    def receive_part(self, layout: list) -> None:
        """Take part in the trainer's broadcast of one bucket of a full weight push (tensors as `layout` says);
        `loaded` ends the push."""
        from credo.distributed.ray.collective import receive_state

        if self.group is None:
            raise RuntimeError("a collective weight push reached a rollout worker that has joined no group")
        load_full(self.target, receive_state(self.group, layout))

    def loaded(self, version: int) -> None:
        """Every bucket of a push is in: later samples carry `version` (a vllm worker, or one with FP8 weights,
        first pushes the host's new weights into its engine / re-quantises them)."""
        self._loaded(version)

    def _loaded(self, version: int) -> None:
        if self.engine == "vllm" or self.fp8_weights:  # re-quantise from the host / push it into the engine
            self.backend.sync_weights(self.host, version)
        self.backend.version = version

    def digest(self) -> str:
        """sha256 of the weights pushes write into (tied aliases once): equal digests, bitwise equal weights."""
        return state_digest(full_state_dict(self.pushed))

    def close(self) -> None:
        self.backend.close()
