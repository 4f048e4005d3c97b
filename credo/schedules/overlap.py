"""`stages.schedule: overlap`: rollout worker processes generate ahead while the trainer trains (ROLL Flash,
arXiv 2510.11345: asynchronous rollout with a staleness bound, queue scheduling, prompt replication).

The prompts form one stream of groups (a prompt's group_size samples): group n is prompt n % P of step n // P + 1,
with that step's problem and sampling seeds, as a synchronous run draws them. Then

    gate       group n may be submitted once the trainer has published version v with n < (v + 1 + S) P + d
               (d: groups dropped so far): generation runs at most S versions ahead, and the groups in flight or
               waiting are bounded by (S + 1) P + d.
    dispatch   groups go out in requests of `request_prompts` prompts (1: ROLL Flash's per-prompt
               dispatch, no batch barrier); with async_workers > 1 each prompt's samples are split over the
               workers (prompt replication, `prompt_replication`), each part to the worker with the fewest
               requests (queue scheduling).
    weights    `sync` publishes the new weights to a shared-memory double buffer; a worker takes them between two
               requests, without stopping generation (`credo.distributed.weight_buffer`).
    consume    step k takes the first P complete groups in the order they finished. A group with a sample older
               than version k-1-S is dropped whole (counted in async/dropped_stale, and one more group is let
               through the gate) unless `stale_policy` is keep.

    partial    (`partial_rollout: true`) a worker interrupts its request when newer weights are published, takes
               them and continues every unfinished response from prompt + partial response, each token stamped
               with the version that drew it (`credo.distributed.partial`); a sample's version, and so its
               staleness, is its oldest token's
    resume     the checkpoint holds the stream's place and the groups in flight or waiting (`state_dict`); a
               resume re-issues those from their stream index with their own problems and seeds, so every group
               is trained (or dropped, counted) once

Settings (`stages.schedule_kwargs`, `OverlapSettings`): max_staleness (S), stale_policy, workers, prompt_replication,
request_prompts, timeout_s, partial_rollout. With rollout.vllm_engine: async the workers are vLLM's asynchronous
engine (`credo.distributed.vllm_overlap`; partial rollout only). It needs the default source's draw (capability `prompt_draw`), a backend whose policy can
be copied into local worker processes (`local_replicas`: hf in this process) and an engine holding the full
parameters (`full_params`: ZeRO <= 2); one trainer process (a refusal row in `credo.capabilities`).

Versions count steps: a sample's `policy_version` is the version its worker held when it started the request (with
partial rollout, its oldest token's).
With a single worker, or several sharing every prompt (replication), groups finish in stream order and none is
ever dropped: the gate alone bounds the staleness. With several workers each taking whole prompts, a group can finish
after groups of later steps and be trained later than planned, so staler than S: that is what is dropped.
Only rank 0 of a single-process run: the workers sample for the whole step.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from credo.capabilities import LOCAL_REPLICAS, PROMPT_DRAW, REPLICA_PUSH
from credo.config.fields import one_of, ranged
from credo.schedules import Schedule
from credo.distributed.rollout_workers import GenerationRequest, LocalRolloutWorkers, RolloutWorkerError, WorkerSpec
from credo.errors import ConfigError
from credo.tasks.render import encode_prompts
from credo.train.batch import Batch
from credo.train.rollout import step_problem_indices, step_seed
from credo.train.staleness import staleness_metrics


@dataclass
class Group:
    """One prompt's samples, filled as the requests that hold them finish."""

    n: int
    """Its place in the stream: prompt n % P of step n // P + 1."""
    problem: object
    samples: list = field(default_factory=list)
    missing: int = 0

    @property
    def version(self) -> int:
        """The oldest policy version among its samples."""
        return min(s.policy_version for s in self.samples)


class OverlapSource:
    """Trains on groups generated ahead by rollout workers (see the module docstring)."""

    def __init__(self, inner, workers, model: torch.nn.Module, *, staleness: int, stale_policy: str,
                 request_prompts: int, timeout_s: float, last_step: int, replicate: bool = True,
                 partial: bool = False):
        self.inner, self.workers, self.model = inner, workers, model
        self.S, self.keep_stale, self.timeout_s = staleness, stale_policy == "keep", timeout_s
        self.replicate, self.partial = replicate, partial
        self.P, self.G = inner.P, inner.G
        self.request_prompts = request_prompts or self.P
        self.last_group = last_step * self.P  # planned groups of the run (drops add replacements past it)
        self.version: int | None = None  # the newest version published to the workers
        self.next_n: int | None = None  # the next group to submit
        self.dropped_groups = 0
        self.open: dict[int, Group] = {}  # submitted, not complete
        self.ready: deque[Group] = deque()  # complete, not trained yet
        self.requests: dict[int, list] = {}  # request id -> [(group n, sample slot)]
        self.request_id = 0
        self.reissue: list[int] = []  # a resume's groups that were in flight or waiting at the checkpoint
        self.consumed: set[int] = set()  # groups trained or dropped by this process (the exactly-once tests read it)
        self.cycle = (time.perf_counter(), sum(workers.busy_seconds()))  # the last rollout's end, workers' busy s

    # ------------------------------------------------------------------ the stage
    def rollout(self, step: int) -> Batch:
        if self.version is None:  # the first step of a fresh run: nothing published yet
            self.publish(step - 1)
        if self.next_n is None:  # the stream starts at this step's prompts (a resume starts mid-run)
            self.next_n = (step - 1) * self.P
        self.top_up()
        waited, dropped, groups = 0.0, 0, []
        while len(groups) < self.P:
            t = time.perf_counter()
            group = self.next_group()
            waited += time.perf_counter() - t
            if step - 1 - group.version > self.S and not self.keep_stale:
                dropped += len(group.samples)
                self.dropped_groups += 1
                self.consumed.add(group.n)
                self.top_up()  # a replacement group
                continue
            groups.append(group)
        batch = Batch(samples=[s for g in groups for s in g.samples],
                      problems=[g.problem for g in groups for _ in g.samples],
                      group_ids=torch.tensor([i for i, g in enumerate(groups) for _ in g.samples]), step=step)
        batch.metrics.update(staleness_metrics(batch, self.S))
        if self.partial:
            batch.metrics.update(partial_metrics(batch))
        batch.metrics.update(self.cycle_metrics(waited, dropped))
        self.consumed.update(g.n for g in groups)
        return batch

    def cycle_metrics(self, waited: float, dropped: int) -> dict[str, float]:
        """Drops, the queue, and the idle fractions of the trainer and the workers since the last rollout returned."""
        now, busy = time.perf_counter(), sum(self.workers.busy_seconds())
        (t0, busy0), self.cycle = self.cycle, (now, busy)
        span = max(now - t0, 1e-9)
        return {"async/dropped_stale": float(dropped), "async/queue_len": float(len(self.ready) + len(self.open)),
                "async/trainer_idle_frac": waited / span,
                "async/rollout_idle_frac": max(0.0, 1.0 - (busy - busy0) / (span * len(self.workers.procs)))}

    def sync(self, model: torch.nn.Module, step: int) -> None:
        self.inner.sync(model, step)  # the trainer's own sampler (evaluation)
        self.publish(step)
        if self.next_n is None:  # a resume syncs before its first step: the stream starts at step + 1's prompts
            self.next_n = step * self.P
        self.top_up()

    def generate(self, prompts, *, temperature: float, seeds):
        return self.inner.generate(prompts, temperature=temperature, seeds=seeds)

    def state_dict(self) -> dict:
        """Where the stream stands: every group below `next_n` was trained or dropped, except `pending` (in flight
        or complete and waiting at the checkpoint); a resume re-issues those from their stream index (the same
        problems and seeds) under the resumed weights, so each group of the stream is trained once."""
        if self.next_n is None:
            return {}
        pending = sorted({*self.open, *(g.n for g in self.ready), *self.reissue})
        return {"next_n": self.next_n, "pending": pending, "dropped_groups": self.dropped_groups}

    def load_state_dict(self, state: dict) -> None:
        if state:  # an old checkpoint ({}) restarts the stream at its step's prompts, as before
            self.next_n, self.reissue = int(state["next_n"]), [int(n) for n in state["pending"]]
            self.dropped_groups = int(state["dropped_groups"])

    def close(self) -> None:
        self.workers.close()
        self.inner.close()

    # ------------------------------------------------------------------ the stream
    def publish(self, version: int) -> None:
        self.workers.publish(self.model, version)
        self.version = version

    def top_up(self) -> None:
        """Submit every group the gate lets through: n < (version + 1 + S) P + dropped, and within the run."""
        limit = min((self.version + 1 + self.S) * self.P, self.last_group) + self.dropped_groups
        while self.reissue:  # all below next_n, so within the gate
            count = min(self.request_prompts, len(self.reissue))
            self.submit(self.reissue[:count])
            self.reissue = self.reissue[count:]
        while self.next_n < limit:
            count = min(self.request_prompts, limit - self.next_n)
            self.submit(list(range(self.next_n, self.next_n + count)))
            self.next_n += count

    def submit(self, stream: list[int]) -> None:
        """Requests for the groups `stream`: each prompt's G samples split over the workers (prompt replication),
        each part to the worker with the fewest requests in its queue."""
        inner, G = self.inner, self.G
        problems = [self.problem(n) for n in stream]
        prompt_ids = encode_prompts(inner.tokenizer, inner.render, problems)
        prompt_of = dict(zip(stream, prompt_ids))
        for n, problem in zip(stream, problems):
            self.open[n] = Group(n, problem, [None] * G, G)
        ways = len(self.workers.procs) if self.replicate else 1
        parts = [p for p in (list(range(G))[w::ways] for w in range(ways)) if p]
        order = sorted(range(len(self.workers.procs)), key=lambda w: self.workers.outstanding[w])
        for worker, part in zip(order, parts):
            tags = [(n, g) for n in stream for g in part]
            seeds = [step_seed(inner.seed, n // self.P + 1, 1 + (n % self.P) * G + g) for n, g in tags]
            prompts = [prompt_of[n] for n, _ in tags]
            self.request_id += 1
            self.requests[self.request_id] = tags
            self.workers.submit(worker, GenerationRequest(self.request_id, prompts, seeds, inner.max_new_tokens,
                                                          inner.temperature, inner.top_p))

    def problem(self, n: int):
        """The problem of stream group n: prompt n % P of step n // P + 1, as a synchronous run draws it."""
        inner = self.inner
        idx = step_problem_indices(inner.seed, n // self.P + 1, len(inner.task) - inner.holdout, self.P)
        return inner.task.train(idx[n % self.P])

    def next_group(self) -> Group:
        """The oldest complete group; waits (up to timeout_s) for the workers to finish one."""
        while not self.ready:
            result = self.workers.next_result(self.timeout_s)
            if result is None:
                raise RolloutWorkerError(
                    f"no rollout worker finished a request in stages.schedule_kwargs.timeout_s = {self.timeout_s} s "
                    f"({len(self.open)} group(s) in flight; requests queued per worker: {self.workers.outstanding})")
            for (n, g), sample in zip(self.requests.pop(result.id), result.samples):
                sample.meta["stream_index"] = n
                group = self.open[n]
                group.samples[g] = sample
                group.missing -= 1
                if group.missing == 0:
                    self.ready.append(self.open.pop(n))
        return self.ready.popleft()


def partial_metrics(batch: Batch) -> dict[str, float]:
    """Partial rollout's metrics: each sample's version span (its newest token's version minus its oldest's) and
    the share of samples interrupted by a weight update at least once."""
    spans = [max(s.policy_versions) - min(s.policy_versions) if s.policy_versions else 0 for s in batch.samples]
    hit = [bool(s.meta.get("interrupted")) for s in batch.samples]
    n = max(len(spans), 1)
    return {"async/version_span_mean": sum(spans) / n, "async/version_span_max": float(max(spans, default=0)),
            "async/interrupted_frac": sum(hit) / n}


@dataclass
class OverlapSettings:
    max_staleness: int = ranged(1, ge=0)
    """S: the most policy versions a trained sample may lag the trainer (0: on-policy, the synchronous run's
    samples generated by the worker process; tests/asynchronous/test_overlap.py checks they are the same)."""
    stale_policy: str = one_of("drop", ("drop", "keep"))
    """A sample that ends up staler than max_staleness is dropped (counted in async/dropped_stale) or kept."""
    workers: int = ranged(1, ge=1)
    """Rollout worker processes, each with its own copy of the policy."""
    prompt_replication: bool = True
    """With workers > 1: spread each prompt's samples over the workers (ROLL Flash's prompt replication); false: each
    request goes whole to one worker, so groups can finish out of order (and some end up stale)."""
    request_prompts: int = ranged(0, ge=0, note="0 = a step's prompts per request")
    """Prompts per generation request; 1 = ROLL Flash's per-prompt dispatch (no batch barrier)."""
    timeout_s: float = ranged(600.0, gt=0)
    """The longest wait for a rollout worker (its start-up, a result) before the run stops naming it."""
    worker_threads: int = ranged(0, ge=0, note="0 = the cores the trainer's run.threads leave, split over the workers")
    """torch threads of each rollout worker; more than the free cores oversubscribes them, which pays when the
    trainer waits for rollout most of a step (it then leaves its core to the workers)."""
    partial_rollout: bool = False
    """Interrupt in-flight requests when new weights are published and continue them under the new version, each
    token stamped with the version that drew it (credo.distributed.partial); samples use per-sample seeds."""


def wrap(source, ctx, s: OverlapSettings) -> OverlapSource:
    """The overlap source: its workers built from the policy folder and the rollout settings."""
    if ctx.world > 1:  # the plan refuses this first (a refusal row)
        raise ConfigError(f"config key 'stages.schedule' = 'overlap' runs one trainer process, got {ctx.world}; "
                          "use stages.schedule: fixed_lag under torchrun")
    r = ctx.recipe
    ro = r.rollout
    if ro.backend == "vllm" and ro.vllm_engine == "async":  # the engine samples beside the trainer in its own process
        from credo.distributed.vllm_overlap import EngineWorkers

        return OverlapSource(source, EngineWorkers(source.backend), ctx.engine.module, staleness=s.max_staleness,
                             stale_policy=s.stale_policy, request_prompts=s.request_prompts, timeout_s=s.timeout_s,
                             last_step=r.run.steps, replicate=False, partial=True)
    others = max(1, (os.cpu_count() or 1) - torch.get_num_threads())
    spec = WorkerSpec(policy_path=ctx.policy_path, dtype=r.model.dtype, eos_id=ctx.tokenizer.eos_token_id,
                      pad_id=ctx.tokenizer.pad_token_id, max_batch=ro.hf_max_batch, rollout_dtype=ro.dtype,
                      fp8_weights=ro.fp8_weights, threads=s.worker_threads or max(1, others // s.workers),
                      partial_rollout=s.partial_rollout)
    workers = LocalRolloutWorkers(ctx.engine.module, spec, s.workers, timeout_s=s.timeout_s)
    return OverlapSource(source, workers, ctx.engine.module, staleness=s.max_staleness, stale_policy=s.stale_policy,
                         request_prompts=s.request_prompts, timeout_s=s.timeout_s, last_step=r.run.steps,
                         replicate=s.prompt_replication, partial=s.partial_rollout)


SCHEDULE = Schedule(name="overlap", doc="rollout worker processes generate up to S versions ahead while the trainer "
                    "trains (ROLL Flash, arXiv 2510.11345)", settings=OverlapSettings, wrap=wrap,
                    source_needs=frozenset({PROMPT_DRAW}), backend_needs=frozenset({LOCAL_REPLICAS}),
                    engine_needs=frozenset({REPLICA_PUSH}), staleness=lambda s: s.max_staleness)
