"""The vLLM rollout backend on vLLM's asynchronous engine (`vllm.v1.engine.async_llm.AsyncLLM`; issue 52, item 2).

`rollout.vllm_engine: async` (docs/vllm.md, "The asynchronous engine"). The offline backend (`VLLMBackend`) calls
`LLM.generate`, one blocking call per batch. This one runs `AsyncLLM`, whose engine core (its own process) keeps
stepping while it holds requests, and offers both interfaces:

    generate(prompts, ...) -> [Sample]     the RolloutBackend call every schedule makes (all requests, then wait)
    submit / take / abort / load_weights   the generation service (`credo.distributed.service`)

How the service maps onto AsyncLLM:

    submit        AsyncLLM.add_request (output_kind=DELTA): the request joins the running batch at the next engine
                  step (continuous batching); a task in the engine thread collects its tokens and log-probs
    take          the results finished or aborted since the last take, in finishing order
    abort         AsyncLLM.abort(request id): vLLM's final output keeps every token the client processed, so the
                  result holds the partial tokens, their sampled log-probs and their versions
    load_weights  pause_generation(mode='keep') -> the weight push -> update_weight_version(v) -> resume. No engine
                  step runs on half-pushed weights. With `recompute_kv` (default), the running requests are
                  preempted (`reset_prefix_cache(reset_running_requests=True)`) and re-read whole (prompt + partial
                  response) under the new weights, as partial rollout does with the hf backend (docs/async.md) and
                  AReaL and verl do; without it they keep the KV cache computed under the old weights (and the
                  prefix cache keeps their blocks: see `load_weights`).

Token versions are vLLM's own: every engine output carries the engine's weight version, and a finished (or aborted)
request reports its tokens' version spans (`CompletionOutput.weight_versions`), turned here into per-token versions.

Threads. `AsyncLLM` lives on an asyncio loop in a dedicated daemon thread; every public method is synchronous (it
hands a coroutine to that loop and waits), so the synchronous trainer calls it like the offline backend.

Not provided (refused by the run plan, `credo.capabilities.BACKENDS['vllm_async']`): tail batching's race and prompt
embeddings (palette). Like `VLLMBackend`, the engine's processes need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from credo.capabilities import BACKENDS
from credo.distributed.rollout import Sample
from credo.distributed.service import GenerationRequest, GenerationResult, ServiceCapabilities, check_request
from credo.distributed.vllm_backend import VLLMBackend, engine_memory_settings, restore_environ
from credo.distributed.weight_sync import WORKER_EXTENSION, push_weights


class _Loop:
    """An asyncio event loop running in its own daemon thread; `run(coro)` waits for the coroutine's result."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="credo-vllm-async", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class _EngineCalls:
    """What `push_weights` calls on an `LLM` (`collective_rpc`, `reset_prefix_cache`), made on the AsyncLLM."""

    def __init__(self, loop: _Loop, engine, recompute_kv: bool):
        self.loop, self.engine, self.recompute_kv = loop, engine, recompute_kv

    def collective_rpc(self, method: str, args: tuple = ()):
        return self.loop.run(self.engine.collective_rpc(method, args=args))

    def reset_prefix_cache(self) -> bool:
        return self.loop.run(self.engine.reset_prefix_cache(reset_running_requests=self.recompute_kv))


@dataclass
class _Live:
    handle: int
    request_id: str
    prompt: list
    seed: int | None
    service: bool
    """Submitted through `submit` (its result goes to `take`), not by `generate` (which waits for it itself)."""
    finish_order: int = -1
    """Its place among the requests that ended (set in the engine thread)."""
    tokens: list = field(default_factory=list)
    log_probs: list = field(default_factory=list)


class AsyncVLLMBackend:
    """Rollouts and the generation service from a `vllm.v1.engine.async_llm.AsyncLLM` (module docstring).

    Takes `VLLMBackend`'s arguments (model_path, dtype, seed, kv_cache_gib, gpu_memory_utilization, max_model_len,
    enforce_eager, weight_transport, fp8_weights, bucket_bytes, **engine_kwargs) but not input_embeddings.
    `recompute_kv`: see `load_weights`.
    """

    provides = BACKENDS["vllm_async"]
    """What this backend provides (`credo.capabilities.BACKENDS`, checked by the run plan)."""
    capabilities = ServiceCapabilities(abort_in_flight=True, weights_in_flight=True, continuous_batching=True,
                                       per_sample_seeds=True)
    kept_set_order = "vllm"
    """vLLM's truncation order (`VLLMBackend.kept_set_order`)."""

    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0, kv_cache_gib: float = 1,
                 gpu_memory_utilization: float = 0.3, max_model_len: int | None = None, enforce_eager: bool = False,
                 weight_transport: str = "auto", fp8_weights: bool = False, recompute_kv: bool = True,
                 bucket_bytes: int | None = None, **engine_kwargs):
        engine_memory_settings(engine_kwargs, kv_cache_gib, gpu_memory_utilization, weight_transport)
        self.engine, self._loop = None, _Loop()
        t0 = time.perf_counter()
        env_before = dict(os.environ)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs

            args = AsyncEngineArgs(model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
                                   enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
                                   worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True, **engine_kwargs)
            self.engine = self._loop.run(_start(args))
            self._loop.run(self.engine.update_weight_version("0"))  # tokens carry credo's version, not 'default'
        except BaseException:
            self._loop.stop()
            raise
        finally:
            restore_environ(env_before)
        self.startup_seconds = time.perf_counter() - t0
        """Wall time of the engine start."""
        self.last_sync_seconds = 0.0
        """Wall time of the last `load_weights` (pause, push, resume)."""
        self.version = 0
        self.weight_transport, self.fp8_weights, self.recompute_kv = weight_transport, fp8_weights, recompute_kv
        self.bucket_bytes = bucket_bytes
        self._calls = _EngineCalls(self._loop, self.engine, recompute_kv)
        self._next = self._finished = 0
        self._live: dict[int, tuple[_Live, object]] = {}  # handle -> (request, its collecting task's future)
        self._done: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

    # -- the RolloutBackend interface ---------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: list[int] | None = None, top_k: int = 0, min_p: float = 0.0,
                 kept_set: bool = False) -> list[Sample]:
        """`VLLMBackend.generate` on the async engine: every prompt is submitted, then all are awaited (the engine
        batches them continuously). `seeds=None` decodes greedily; `kept_set` records nothing (as VLLMBackend)."""
        self._check_open("generate")
        params = VLLMBackend._sampling_params(self, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                              top_p=top_p, seeds=seeds, top_k=top_k, min_p=min_p)
        added = self._add([list(p) for p in prompts], params, [None] * len(prompts) if seeds is None else seeds,
                          service=False)
        results = self._loop.run(self._collect_all(added))
        return [Sample(r.prompt_ids, r.response_ids, [1] * len(r.response_ids), r.log_probs, r.finished,
                       min(r.policy_versions) if r.policy_versions else self.version,
                       policy_versions=r.policy_versions if len(set(r.policy_versions)) > 1 else None)
                for r in results]

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        """The RolloutBackend name of `load_weights`."""
        self.load_weights(model, version)

    # -- the generation service ---------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> int:
        """Add the request to the engine (it joins the running batch at the next step); returns its handle."""
        self._check_open("submit")
        check_request(request)
        s = request.sampling
        (params,) = VLLMBackend._sampling_params(self, [list(request.prompt_ids)], max_new_tokens=s.max_new_tokens,
                                                 temperature=s.temperature, top_p=s.top_p,
                                                 seeds=None if request.seed is None else [request.seed],
                                                 top_k=s.top_k, min_p=s.min_p)
        ((live, collector),) = self._add([list(request.prompt_ids)], [params], [request.seed], service=True)
        fut = self._loop.spawn(self._collect(live, collector))
        with self._lock:
            self._live[live.handle] = (live, fut)
        fut.add_done_callback(lambda f: self._done.put(None))  # wakes a waiting take()
        return live.handle

    def take(self, *, wait: bool = True, timeout: float | None = None) -> list[GenerationResult]:
        """The results finished or aborted since the last take, in finishing order. `wait`: block until there is one
        (or nothing submitted is in flight); `queue.Empty` after `timeout` seconds. An engine error is raised here."""
        while True:
            with self._lock:
                done = [(live, fut) for live, fut in self._live.values() if live.service and fut.done()]
                for live, _ in done:
                    del self._live[live.handle]
                waiting = any(live.service for live, _ in self._live.values())
            if done or not wait or not waiting:
                return [fut.result() for _, fut in sorted(done, key=lambda e: e[0].finish_order)]
            self._done.get(timeout=timeout)  # a request ended (perhaps one already taken: then look again)

    def abort(self, handle: int) -> bool:
        """Stop a request in flight; its result (next `take`) keeps the tokens and log-probs produced so far. False
        when it was not in flight: unknown, already taken, or finished before the abort reached the engine (then its
        result is the finished one)."""
        with self._lock:
            entry = self._live.get(handle)
        if entry is None or entry[1].done():
            return False
        live, fut = entry
        self._loop.run(self.engine.abort(live.request_id))
        return fut.result().finish_reason == "abort"

    def load_weights(self, model, version: int, *, recompute_kv: bool | None = None) -> None:
        """New weights between engine steps; every token sampled after this carries `version` (module docstring).
        `model`: the trainer's module (or a DeepSpeed engine), as `VLLMBackend.sync_weights` takes it. `recompute_kv`:
        re-read the running requests under the new weights (True) or keep their old KV cache (False: then the prefix
        cache cannot be reset while they run, and a later request sharing their prefix may reuse blocks computed under
        the old weights; a research switch that no schedule uses); None: the backend's setting."""
        self._check_open("load_weights")
        self._calls.recompute_kv = self.recompute_kv if recompute_kv is None else recompute_kv
        t0 = time.perf_counter()
        transform = None
        if self.fp8_weights:
            from credo.distributed.rollout_copy import fp8_state, fp8_weight_names

            names = fp8_weight_names(model)
            transform = lambda state: fp8_state(state, names)  # noqa: E731
        self._loop.run(self.engine.pause_generation(mode="keep", clear_cache=False))
        try:
            push_weights(self._calls, model, transport=self.weight_transport, transform=transform,
                         bucket_bytes=self.bucket_bytes)
            self._loop.run(self.engine.update_weight_version(str(version)))
            self.version = version
        finally:
            self._loop.run(self.engine.resume_generation())
        self.last_sync_seconds = time.perf_counter() - t0

    def received(self, handle: int) -> int:
        """Tokens of a request in flight that this process has received so far (0 once taken or unknown)."""
        with self._lock:
            entry = self._live.get(handle)
        return len(entry[0].tokens) if entry else 0

    def in_flight(self) -> int:
        """Submitted requests not ended yet (`generate`'s are its own)."""
        with self._lock:
            return sum(not fut.done() for _, fut in self._live.values())

    def close(self, timeout: float = 30.0) -> None:
        """Abort what is in flight, stop the engine's processes and the loop thread; safe to call twice."""
        if self.engine is None:
            return
        with self._lock:
            ids = [live.request_id for live, fut in self._live.values() if not fut.done()]
        if ids:
            self._loop.run(self.engine.abort(ids), timeout=timeout)
        engine, self.engine, self._calls = self.engine, None, None
        engine.shutdown(timeout=timeout)
        self._loop.stop()

    # -- internals ----------------------------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self.engine is None:
            raise RuntimeError(f"{what} called after close()")

    def _add(self, prompts: list[list[int]], params: list, seeds: list, *, service: bool) -> list:
        """Add requests to the engine in one call on its loop (they reach the same engine step; `submit` waits until
        the engine has its request, so an abort right after finds it); returns their records and collectors.
        Service requests stream their tokens (DELTA: `received`, a partial result on abort); `generate`'s come
        whole at their end (FINAL_ONLY: less work per engine step in this process)."""
        from vllm.sampling_params import RequestOutputKind

        kind = RequestOutputKind.DELTA if service else RequestOutputKind.FINAL_ONLY
        with self._lock:
            first, self._next = self._next, self._next + len(prompts)
        lives = [_Live(first + i, f"credo-{first + i}", p, seed, service)
                 for i, (p, seed) in enumerate(zip(prompts, seeds))]
        for sp in params:
            sp.output_kind = kind
        return list(zip(lives, self._loop.run(self._add_all(lives, params))))

    async def _add_all(self, lives: list, params: list) -> list:
        from vllm.inputs import TokensPrompt

        return [await self.engine.add_request(live.request_id, TokensPrompt(prompt_token_ids=live.prompt), sp)
                for live, sp in zip(lives, params)]

    async def _collect_all(self, added: list) -> list:
        return await asyncio.gather(*(self._collect(live, collector) for live, collector in added))

    async def _collect(self, live: _Live, collector) -> GenerationResult:
        """Read the request's outputs until its final one (finished or aborted)."""
        try:
            while True:
                out = collector.get_nowait() or await collector.get()
                comp = out.outputs[0]
                new = list(comp.token_ids)
                live.tokens += new
                live.log_probs += [float(pos[t].logprob) for pos, t in zip(comp.logprobs or [], new)]
                if out.finished:
                    break
        finally:
            collector.close()
            live.finish_order, self._finished = self._finished, self._finished + 1
        reason = str(comp.finish_reason)
        if reason not in ("stop", "length", "abort"):
            raise RuntimeError(f"vLLM ended request {live.request_id} with finish reason {reason!r}")
        versions = span_versions(comp.weight_versions, len(live.tokens), self.version)
        return GenerationResult(live.handle, live.prompt, live.tokens, live.log_probs, versions, reason,
                                meta={"seed": live.seed, "version": self.version})


async def _start(args):
    """Build the AsyncLLM inside the engine thread's loop (its output handler is a task of that loop)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)


def span_versions(spans, n: int, fallback: int) -> list[int]:
    """Per-token versions from vLLM's `WeightVersionSpan`s (version label, start, end) over `n` tokens; `fallback`
    for tokens no span covers. A label that is not an integer (vLLM's initial 'default') is an error: this backend sets
    an integer version before any request."""
    out = [fallback] * n
    for span in spans or ():
        if not str(span.version).isdigit():
            raise RuntimeError(f"vLLM reported weight version {span.version!r}, expected an integer (load_weights)")
        out[span.start:span.end] = [int(span.version)] * (span.end - span.start)
    return out
