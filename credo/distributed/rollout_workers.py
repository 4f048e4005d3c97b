"""Rollout worker processes for `rollout.async_mode: overlap`: generation beside training, on this machine.

    LocalRolloutWorkers(model, spec, n)       n spawned processes, each with its own copy of the policy and an
                                              hf backend (`credo.distributed.rollout.HFBackend`)
      .publish(model, version)                the trainer's new weights, through a shared-memory double buffer
                                              (`credo.distributed.weight_buffer`): taken between two requests
      .submit(worker, request)                a generation request to one worker's queue (queue scheduling: the
                                              caller picks the worker, e.g. the one with the fewest requests)
      .next_result(timeout_s)                 the next finished request, from any worker; None after timeout_s
      .busy_seconds()                         each worker's seconds spent generating (its idle time is the rest)
      .close()

This is the shape a remote pool has (Ray actors: one per engine, a queue of requests each, weights pushed by
version), so another implementation can stand behind the same five calls. Every wait has a timeout: a worker that
died (an exception, a kill) is an error naming it, its pid and exit code, and a worker whose trainer is gone exits
by itself within a second.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from credo.distributed.weight_buffer import WeightBuffers
from credo.errors import TrainingError


@dataclass
class WorkerSpec:
    """What a worker builds its policy copy and sampler from."""

    policy_path: str
    """The folder the trainer's policy was loaded from (its architecture; the weights come from the buffers)."""
    dtype: str
    """model.dtype."""
    eos_id: int
    pad_id: int
    max_batch: int = 0
    """rollout.hf_max_batch."""
    rollout_dtype: str | None = None
    """rollout.dtype."""
    fp8_weights: bool = False
    """rollout.fp8_weights."""
    threads: int = 1
    """torch intra-op threads of each worker."""
    partial_rollout: bool = False
    """Interrupt a request when newer weights are published and continue it under them, each token stamped with
    its version (`credo.distributed.partial`); samples are drawn with per-sample seeds."""


@dataclass
class GenerationRequest:
    """One request: `prompts[i]` sampled once with `seeds[i]` (the caller keeps which sample each one is)."""

    id: int
    prompts: list[list[int]]
    seeds: list[int]
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class GenerationResult:
    id: int
    worker: int
    samples: list
    """One `Sample` per prompt of the request, `policy_version` = the version the worker held when it started."""
    version: int


class RolloutWorkerError(TrainingError):
    """A rollout worker died or stopped answering; the message names it."""


class LocalRolloutWorkers:
    """`n` rollout worker processes on this machine (spawned: the trainer's process group and threads stay its own)."""

    def __init__(self, model: torch.nn.Module, spec: WorkerSpec, n: int, *, timeout_s: float):
        ctx = torch.multiprocessing.get_context("spawn")
        self.timeout_s = timeout_s
        self.buffers = WeightBuffers(model, ctx)
        self.busy = ctx.Array("d", [0.0] * n, lock=False)
        self.results = ctx.Queue()
        self.requests = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=worker_main, name=f"credo-rollout-{i}", daemon=True,
                                  args=(i, spec, self.buffers, self.requests[i], self.results, self.busy, os.getpid()))
                      for i in range(n)]
        for p in self.procs:
            p.start()
        self.outstanding = [0] * n  # requests submitted to each worker and not yet answered
        self.closed = False

    def publish(self, model: torch.nn.Module, version: int) -> None:
        try:
            self.buffers.publish(model, version, timeout_s=self.timeout_s)
        except TimeoutError as e:
            self.check_alive()
            raise RolloutWorkerError(f"rollout workers: {e}") from None

    def submit(self, worker: int, request: GenerationRequest) -> None:
        self.outstanding[worker] += 1
        self.requests[worker].put(request)

    def next_result(self, timeout_s: float) -> GenerationResult | None:
        """The next finished request (None after `timeout_s`); a dead worker raises `RolloutWorkerError`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                kind, worker, payload = self.results.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                self.check_alive()
                if time.monotonic() >= deadline:
                    return None
                continue
            if kind == "error":
                raise RolloutWorkerError(f"rollout worker {worker} (pid {self.procs[worker].pid}) failed:\n{payload}")
            if kind == "done":
                self.outstanding[worker] -= 1
                return payload

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                raise RolloutWorkerError(f"rollout worker {i} (pid {p.pid}) died with exit code {p.exitcode} "
                                         f"holding {self.outstanding[i]} request(s); rollout.async_mode: overlap stops")

    def busy_seconds(self) -> list[float]:
        return list(self.busy)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q, p in zip(self.requests, self.procs):
            if p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for q in (*self.requests, self.results):
            q.cancel_join_thread()
            q.close()


def fault_delay_s(index: int, variable: str = "CREDO_FAULT_ROLLOUT_DELAY_S") -> float:
    """Test hook: CREDO_FAULT_ROLLOUT_DELAY_S=0.5 slows every worker's requests by 0.5 s; '1:0.5' only worker 1's.
    CREDO_FAULT_TOKEN_DELAY_S (same syntax) slows each token of a partial rollout."""
    delay = 0.0
    for part in filter(None, os.environ.get(variable, "").replace(" ", "").split(",")):
        who, _, seconds = part.rpartition(":")
        if who == "" or int(who) == index:
            delay = float(seconds)
    return delay


def worker_main(index: int, spec: WorkerSpec, buffers: WeightBuffers, requests, results, busy, parent: int) -> None:
    """A worker's loop: take the newest weights, generate the request, send the samples back; until told to stop,
    or until its trainer is gone."""
    try:
        from credo.distributed.rollout import HFBackend
        from credo.distributed.service_client import WholeRequestService, generate_through
        from credo.models import load_causal_lm

        torch.set_num_threads(spec.threads)
        model = load_causal_lm(spec.policy_path, spec.dtype).eval().requires_grad_(False)
        names = [n for n, _ in model.named_parameters()]
        if names != buffers.names:
            raise ValueError(f"the worker's model from {spec.policy_path} has parameters {names[:3]}..., the "
                             f"trainer's {buffers.names[:3]}...")
        backend = HFBackend(model, SimpleNamespace(eos_token_id=spec.eos_id, pad_token_id=spec.pad_id),
                            max_batch=spec.max_batch, dtype=spec.rollout_dtype, fp8_weights=spec.fp8_weights,
                            per_sample_seeds=spec.partial_rollout)
        service = WholeRequestService(backend)  # whole requests through the service; partial rollout below uses the
        # backend token by token (credo.distributed.partial)
        version, delay_s, token_delay_s = -1, fault_delay_s(index), fault_delay_s(index, "CREDO_FAULT_TOKEN_DELAY_S")

        def take(have: int) -> int:
            newer = buffers.take(model, have)
            if newer != have:
                service.load_weights(model, newer)
            return newer

        def newer(have: int) -> bool:  # asked after every token of a partial rollout
            if token_delay_s:  # the test hook's slow decoding, so that weights arrive mid-request
                time.sleep(token_delay_s)
            return buffers.newest() > have

        while True:
            try:
                req = requests.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:  # the trainer died (a SIGKILL leaves daemon workers behind otherwise)
                    return
                continue
            if req is None:
                return
            t0 = time.perf_counter()
            version = start = take(version)
            if delay_s:  # the test hook's slow generation: after the weights are taken, as a long request's would be
                time.sleep(delay_s)
            if spec.partial_rollout:
                from credo.distributed.partial import generate_partial

                samples = generate_partial(backend, req.prompts, req.seeds, max_new_tokens=req.max_new_tokens,
                                           temperature=req.temperature, top_p=req.top_p, version=version,
                                           newer=newer, take=take)
                version = max([version] + [v for s in samples for v in s.policy_versions])
            else:
                samples = generate_through(service, req.prompts, max_new_tokens=req.max_new_tokens,
                                           temperature=req.temperature, top_p=req.top_p, seeds=req.seeds)
            busy[index] += time.perf_counter() - t0
            results.put(("done", index, GenerationResult(req.id, index, samples, start)))
    except BaseException:  # noqa: BLE001 - reported to the trainer, which names this worker
        results.put(("error", index, traceback.format_exc()[-3000:]))
        raise SystemExit(1)
