"""`RayRolloutBackend`: the rollout backend protocol (credo.distributed.rollout) over a pool of Ray actors.

    backend = RayRolloutBackend(policy_path, workers=2, resources={"CPU": 1}, sync="delta")
    samples = backend.generate(prompts, max_new_tokens=..., temperature=..., top_p=..., seeds=seeds)
    backend.sync_weights(engine.module, step)

`generate` cuts the prompts into shards (contiguous, `shards_per_worker` per worker), hands each to an idle worker
and gathers the Samples in the caller's order. A shard whose worker dies, hangs past `call_timeout_s` or leaves is
handed to another worker with the same seeds; with per-sample seeding (the default) its tokens are the same as they
would have been, so a fault or a change of pool size does not change the step's result. A lost worker is replaced
(counted in `cluster/<role>_restarts`) and gets the current weights before its next shard; so does a joining one.

Weights travel through the Ray object store bucket by bucket: the trainer's weights come in buckets of about
`bucket_bytes` (`credo.distributed.ray.weights.wire_buckets`: FSDP2 gathers each as it is asked for), each is one
`ray.put`, every worker loads it (`load_part`) before the next bucket is made, and a last call (`loaded`) makes the
new weights the worker's (its version; a vllm worker pushes them into its engine then). So the trainer's process
holds one bucket of wire tensors at a time (the object store keeps every bucket of the last full push, for a worker
that joins or replaces a lost one). `sync='delta'` sends only the elements whose bits changed in the wire dtype
since the last push (credo.distributed.ray.weights), bucket by bucket too; it keeps the last pushed weights whole
in this process to diff against. With `transport='gloo'` or `'nccl'` a full push is instead one broadcast per
bucket in a process group of the trainer and the workers (credo.distributed.ray.collective), formed again whenever
the pool's members change; each bucket is also put in the object store for later joiners, and once a member is lost
the push's remaining buckets go through the object store. A worker that joins or replaces a lost one gets its first
weights through the object store, then joins the group at the next push.
The wire dtype is the rollout dtype (`dtype`), or the trainer's with FP8 weights (they are quantised from it).
`generate_race` (tail batching's short round) runs the whole race on one worker: which requests are aborted depends
on when every group finishes, so one engine must see them all; a lost or hung worker's race is run again elsewhere
with the same seeds. `prefix_embeds` (soft prompts) travel with their shard.
The module is over 400 lines: dispatch, fault handling, the race and the three push paths share the pool's state,
and a split would pass that state between modules.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from credo.capabilities import BACKENDS
from credo.distributed.ray.config import ClusterConfig, resources_of
from credo.distributed.ray.rollout_worker import RolloutWorker
from credo.distributed.ray.runtime import ClusterWorkerError, WorkerGroup, loss_errors, user_error
from credo.distributed.engines.weights import BUCKET_BYTES, split_buckets
from credo.distributed.ray.weights import diff_state, nbytes, wire_buckets
from credo.distributed.rollout import Sample
from credo.distributed.rollout_copy import DTYPES


class RayRolloutBackend:
    """Rollouts on `workers` Ray actors, each holding the model of `model_path` (see the module docstring).

    Args:
        model_path: the policy folder (or the judge's, with role='judge'); every worker loads it.
        workers: actors at start; resources: the Ray request of each ({CPU: 1}, {GPU: 1}, {decode_gpu: 1}).
        engine: 'hf' or 'vllm'; model_dtype: the trainer's dtype; dtype: the rollout dtype (None: the trainer's).
        fp8_weights, max_batch, per_sample_seeds: as `HFBackend` (per_sample_seeds=False needs one worker).
        threads: torch threads per worker; sync: 'full' or 'delta'.
        transport: 'object_store', or a collective broadcast: 'gloo' (CPU workers) or 'nccl' (GPU workers); the
            collective sends full weights only (sync='full').
        elastic: (min, max) workers while they join and leave; None = a fixed pool.
        shards_per_worker: shards of a call per worker (more: finer load balance and less work redone on a loss).
        initial_model: push these weights at start (version 0) instead of trusting the folder's to be the trainer's.
        prompt_embeds: vllm workers: start their engines taking prompt embeddings (soft prefixes); hf workers take
            them without it.
        bucket_bytes: bytes of the trainer's tensors per bucket of a push (`credo.distributed.engines.weights`).
    """

    provides = BACKENDS["ray"]
    """What this backend provides (`credo.capabilities.BACKENDS`, checked by the run plan)."""

    def __init__(self, model_path: str, *, workers: int = 1, resources: dict | None = None, engine: str = "hf",
                 model_dtype: str = "float32", dtype: str | None = None, fp8_weights: bool = False, max_batch: int = 0,
                 per_sample_seeds: bool = True, threads: int = 1, sync: str = "full", role: str = "rollout",
                 max_restarts: int = 3, startup_timeout_s: float = 300.0, call_timeout_s: float = 600.0,
                 elastic: tuple[int, int] | None = None, shards_per_worker: int = 1, initial_model=None,
                 vllm_kwargs: dict | None = None, transport: str = "object_store", prompt_embeds: bool = False,
                 bucket_bytes: int = BUCKET_BYTES):
        if sync not in ("full", "delta"):
            raise ValueError(f"sync is {sync!r}, expected 'full' or 'delta'")
        if transport not in ("object_store", "gloo", "nccl"):
            raise ValueError(f"transport is {transport!r}, expected 'object_store', 'gloo' or 'nccl'")
        if transport != "object_store" and sync != "full":
            raise ValueError(f"transport {transport!r} broadcasts dense tensors: it needs sync='full', not {sync!r}")
        self.transport = transport
        self._coll = None  # the collective group (rank 0 here), and the (slot, handle) members it was formed with
        self._coll_members: tuple = ()
        self.groups_formed = 0  # collective groups formed since the last metrics() (membership changes show here)
        if workers < 1 or shards_per_worker < 1:
            raise ValueError(f"workers={workers}, shards_per_worker={shards_per_worker}: expected >= 1 each")
        if not per_sample_seeds and (workers > 1 or elastic):
            raise ValueError("per_sample_seeds=False draws one RNG stream per call: the tokens would depend on the "
                             "split over workers, so it needs workers=1 and no elastic pool")
        self.role, self.sync_mode, self.call_timeout_s = role, sync, call_timeout_s
        self.per_sample_seeds, self.shards_per_worker = per_sample_seeds, shards_per_worker
        self.elastic = elastic
        self.kept_set_order = engine  # whose stage order the workers' truncation follows (credo.algos.kept_set)
        self.wire_dtype = DTYPES[model_dtype if fp8_weights or dtype is None else dtype]
        self.group = WorkerGroup(role, RolloutWorker, args=(str(model_path),), kwargs=dict(
            engine=engine, model_dtype=model_dtype, dtype=dtype, fp8_weights=fp8_weights, max_batch=max_batch,
            per_sample_seeds=per_sample_seeds, threads=threads, vllm_kwargs=vllm_kwargs, prompt_embeds=prompt_embeds),
            resources=resources or {"CPU": 1}, max_restarts=max_restarts, startup_timeout_s=startup_timeout_s)
        self._lock = threading.RLock()
        self.active: list[int] = []
        self.leaving: set[int] = set()
        self.version = 0
        self.bucket_bytes = bucket_bytes
        self.pushed = False  # any push yet (False: the workers sample the folder's weights)
        self._last: dict[str, torch.Tensor] | None = None  # sync='delta': wire state of the last push, to diff with
        self._full_refs: list | None = None  # the last push's full buckets in the object store (made when needed)
        self.sync_metrics: dict = {}
        self.running: set[int] = set()  # slots with a shard in flight
        self.redone_shards = 0  # shards handed out again after their worker died, hung or left
        try:
            self.active = self.group.start(workers)
            if initial_model is not None:
                self.sync_weights(initial_model, 0)
        except BaseException:
            self.group.close()
            raise

    @classmethod
    def from_cluster(cls, cluster: ClusterConfig, model_path: str, *, role: str = "rollout", **kwargs) -> "RayRolloutBackend":
        """Built from the recipe's `cluster:` section (the rollout or judge role); kwargs: engine, dtypes, initial_model."""
        rc = getattr(cluster, role)
        extra = {}
        if role == "rollout":
            el = rc.elastic
            extra = dict(per_sample_seeds=rc.per_sample_seeds, threads=rc.threads, sync=cluster.sync,
                         transport=cluster.sync_transport,
                         elastic=(el.min, el.max) if el.max else None)
        return cls(model_path, workers=rc.workers, resources=resources_of(rc), role=role, max_restarts=rc.max_restarts,
                   startup_timeout_s=cluster.startup_timeout_s, call_timeout_s=cluster.call_timeout_s, **extra, **kwargs)

    # ------------------------------------------------------------------------------------ generate
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None, top_k: int = 0, min_p: float = 0.0, kept_set: bool = False,
                 prefix_embeds: torch.Tensor | None = None) -> list[Sample]:
        """Sample one response per prompt on the pool; Samples in the caller's order. `seeds=None` decodes greedily.
        `top_k`, `min_p`, `kept_set`: passed to each worker's engine (`HFBackend.generate`), only when set.
        `prefix_embeds` [N, k, d]: prompt i's soft prefix, sent with i's shard."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        if prefix_embeds is not None and (prefix_embeds.dim() != 3 or prefix_embeds.shape[0] != len(prompts)):
            raise ValueError(f"prefix_embeds has shape {list(prefix_embeds.shape)}, expected [{len(prompts)}, k, d] "
                             "(one row of k embeddings per prompt)")
        if not prompts:
            return []
        self.group.check()
        kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        kwargs.update({k: v for k, v in dict(top_k=top_k, min_p=min_p, kept_set=kept_set).items() if v})
        with self._lock:
            n_workers = len(self.active)
        if not self.per_sample_seeds and n_workers > 1 and seeds is not None:  # greedy decoding splits freely
            raise RuntimeError(f"role '{self.role}' has {n_workers} workers but per_sample_seeds=False")
        n_shards = min(len(prompts), n_workers * self.shards_per_worker)
        bounds = [len(prompts) * i // n_shards for i in range(n_shards + 1)]
        pending = deque(range(bounds[i], bounds[i + 1]) for i in range(n_shards))
        out: list[Sample | None] = [None] * len(prompts)
        inflight: dict = {}  # ref -> (slot, handle, shard, dispatched at)
        embeds = None if prefix_embeds is None else prefix_embeds.detach().cpu()
        try:
            while pending or inflight:
                self._dispatch(pending, inflight, prompts, seeds, kwargs, embeds)
                self._collect(pending, inflight, out)
        finally:
            self.running.clear()
        return out  # type: ignore[return-value]

    def generate_race(self, prompts: list[list[int]], groups: list[int], *, need: int, groups_needed: int,
                      max_new_tokens: int, temperature: float, top_p: float, seeds: list[int] | None,
                      chunk_tokens: int = 8):
        """Tail batching's short round (`credo.distributed.race`), run whole on one worker's backend (see the module
        docstring): a `RaceResult`. A worker that dies or hangs is replaced and the race runs again on another with
        the same seeds, so its result does not change."""
        import ray

        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has length {len(seeds)}, expected {len(prompts)} like prompts")
        if len(groups) != len(prompts):
            raise ValueError(f"groups has length {len(groups)}, expected {len(prompts)} like prompts")
        self.group.check()
        kwargs = dict(need=need, groups_needed=groups_needed, max_new_tokens=max_new_tokens, temperature=temperature,
                      top_p=top_p, chunk_tokens=chunk_tokens)
        while True:
            with self._lock:
                ready = [s for s in self.active if s not in self.leaving and s in self.group.handles]
            if not ready:
                raise ClusterWorkerError(f"role '{self.role}': no worker left to run the race")
            slot = ready[0]
            handle = self.group.handles[slot]
            t0 = time.monotonic()
            ref = handle.generate_race.remote(prompts, groups, seeds, kwargs)
            self.running.add(slot)
            try:
                done, _ = ray.wait([ref], num_returns=1, timeout=self.call_timeout_s)
                result = ray.get(ref) if done else None
            except loss_errors() as e:
                result, cause = None, e
            except Exception as e:  # the backend itself raised: as a local backend would, it stops the step
                raise user_error(e) from None
            else:
                cause = f"a call ran past cluster.call_timeout_s = {self.call_timeout_s} s"
            finally:
                self.running.discard(slot)
            if result is not None:
                self.group.stats.busy(time.monotonic() - t0)
                return result
            self.redone_shards += 1
            self._lost(slot, handle, cause)

    def _dispatch(self, pending: deque, inflight: dict, prompts, seeds, kwargs, embeds=None) -> None:
        with self._lock:
            busy = {slot for slot, *_ in inflight.values()}
            idle = [s for s in self.active if s not in busy and s not in self.leaving]
        if pending and not idle and not inflight:
            raise ClusterWorkerError(f"role '{self.role}': no worker left to run {len(pending)} shard(s)")
        self.group.stats.queue(max(0, len(pending) - len(idle)))
        for slot in idle:
            if not pending:
                break
            handle = self.group.handles.get(slot)
            if handle is None:  # left between the two looks
                continue
            shard = pending.popleft()
            kw = kwargs if embeds is None else {**kwargs, "prefix_embeds": embeds[shard.start:shard.stop]}
            ref = handle.generate.remote([prompts[i] for i in shard], None if seeds is None else [seeds[i] for i in shard],
                                         kw)
            inflight[ref] = (slot, handle, shard, time.monotonic())
            self.running.add(slot)

    def _collect(self, pending: deque, inflight: dict, out: list) -> None:
        import ray

        now = time.monotonic()
        first_deadline = min(t + self.call_timeout_s for *_, t in inflight.values())
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, min(first_deadline - now, 1.0)))
        for ref in ready:
            slot, handle, shard, t0 = inflight.pop(ref)
            self.running.discard(slot)
            self.group.stats.busy(time.monotonic() - t0)
            try:
                samples = ray.get(ref)
            except loss_errors() as e:
                pending.appendleft(shard)  # redone elsewhere (or here once replaced), with the same seeds
                self.redone_shards += 1
                self._lost(slot, handle, e)
                continue
            except Exception as e:  # the backend itself raised: as a local backend would, it stops the step
                raise user_error(e) from None
            for i, s in zip(shard, samples):
                out[i] = s
        now = time.monotonic()
        for ref, (slot, handle, shard, t0) in list(inflight.items()):
            if now - t0 > self.call_timeout_s:  # hung: kill it; the shard is redone like a lost worker's
                del inflight[ref]
                self.running.discard(slot)
                pending.appendleft(shard)
                self.redone_shards += 1
                self._lost(slot, handle, f"a call ran past cluster.call_timeout_s = {self.call_timeout_s} s")

    def _lost(self, slot: int, handle, cause) -> None:
        """A worker died, hung or left: a leaving one is dropped; any other is replaced and given the weights."""
        with self._lock:
            if slot in self.leaving or slot not in self.active:
                return
        from ray.exceptions import GetTimeoutError

        while True:  # a replacement that dies or hangs while it takes the weights is itself replaced (and counted)
            handle = self.group.replace(slot, handle, cause)
            if not self.pushed:
                return
            try:
                return self._push_full(handle)
            except (*loss_errors(), GetTimeoutError) as e:
                cause = e

    # ------------------------------------------------------------------------------------ weights
    def _full_payloads(self) -> list:
        """The last push's weights as full buckets in the object store (sync='delta' puts them the first time a
        worker needs them)."""
        import ray

        if self._full_refs is None:
            self._full_refs = [ray.put(("full", dict(b))) for b in split_buckets(self._last.items(), self.bucket_bytes)]
        return self._full_refs

    def _push_full(self, handle) -> None:
        """One worker (joining, or replacing a lost one) gets the last push: every full bucket in turn, then its
        version. The calls run in order on the actor; the ones still running past the timeout raise."""
        import ray

        calls = [handle.load_part.remote(ref) for ref in self._full_payloads()]
        ray.get([*calls, handle.loaded.remote(self.version)], timeout=self.call_timeout_s)

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        """Push the trainer's weights to every worker, bucket by bucket (full, or a delta against the last push);
        later samples carry `version`. A worker lost during the push is replaced and given the full weights."""
        import ray

        t0 = time.perf_counter()
        r = self.role
        delta = self.sync_mode == "delta" and self._last is not None
        full_bytes = sent_bytes = changed = total = 0
        with self._lock:
            slots = [s for s in self.active if s not in self.leaving]
        members = tuple((s, self.group.handles[s]) for s in slots)
        collective = self.transport != "object_store"
        if collective and (self._coll is None or members != self._coll_members):
            members = self._form_group(members)
        lost: dict[int, tuple] = {}  # slot -> (handle, cause): replaced once every bucket is out
        refs, last = [], {} if self.sync_mode == "delta" else None
        for bucket in wire_buckets(model, self.wire_dtype, self.bucket_bytes):
            size = nbytes(bucket)
            full_bytes += size
            if delta:
                d = diff_state(self._last, bucket)
                changed, total, sent_bytes = changed + d.changed, total + d.total, sent_bytes + d.sent_bytes
                payload, d = ("delta", d), None
            else:
                payload, sent_bytes = ("full", bucket), sent_bytes + size
            if last is not None:
                last.update(bucket)
            ref = ray.put(payload)
            if not delta:
                refs.append(ref)
            live = tuple(m for m in members if m[0] not in lost)
            if collective and self._coll is not None:
                self._collective_bucket(bucket, live, lost)
            else:
                self._object_store_bucket(ref, live, lost)
            del bucket, payload, ref
        self.version, self.pushed = version, True
        self._last, self._full_refs = last, (None if delta else refs)
        calls = {h.loaded.remote(version): (s, h) for s, h in members if s not in lost}
        self._wait(calls, lost, "weight push")
        for slot, (handle, cause) in lost.items():
            self._lost(slot, handle, cause)
        stats = {f"cluster/{r}_sync_full_bytes": full_bytes, f"cluster/{r}_sync_bytes": sent_bytes}
        if delta:
            stats[f"cluster/{r}_sync_changed_frac"] = changed / max(total, 1)
        self.sync_metrics = {**stats, f"cluster/{r}_sync_s": time.perf_counter() - t0}

    def _wait(self, calls: dict, lost: dict, what: str, wait_s: float | None = None, broke=None) -> None:
        """Wait for `calls` (ref -> (slot, handle)); the ones lost, hung or (after a broken broadcast `broke`)
        failed go into `lost`; any other failure is the backend's own and stops the step."""
        import ray

        limit = f"cluster.call_timeout_s = {self.call_timeout_s} s" if wait_s is None else f"{wait_s} s"
        wait_s = self.call_timeout_s if wait_s is None else wait_s
        ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=wait_s)
        for ref in late:
            lost[calls[ref][0]] = (calls[ref][1], f"{what} ran past {limit}")
        for ref in ready:
            try:
                ray.get(ref)
            except loss_errors() as e:
                lost[calls[ref][0]] = (calls[ref][1], e)
            except Exception as e:
                if broke is None:
                    raise user_error(e) from None
                lost[calls[ref][0]] = (calls[ref][1], f"its collective weight push broke off: {user_error(e)}")

    def _object_store_bucket(self, ref, members: tuple, lost: dict) -> None:
        """One bucket (an object-store ref) loaded by every member, each in turn after its earlier buckets."""
        calls = {h.load_part.remote(ref): (s, h) for s, h in members}
        self._wait(calls, lost, "weight push")

    # ------------------------------------------------------------------------------------ collective pushes
    def _collective_bucket(self, bucket: dict, members: tuple, lost: dict) -> None:
        """One bucket as one broadcast (or a few, by dtype) from here (rank 0) to the group's members. A member lost
        or hung during it is replaced once the push is done; the group is dropped then (formed again at the next
        push), and the push's later buckets go through the object store."""
        from credo.distributed.ray.collective import broadcast_state, layout_of

        calls = {h.receive_part.remote(layout_of(bucket)): (s, h) for s, h in members}
        try:
            broadcast_state(self._coll, bucket)
            failed = None
        except RuntimeError as e:  # a member died or hung mid-broadcast (the group's timeout is call_timeout_s)
            failed = e
        # after a failed broadcast a member may wait for bytes that never come: it is given a short grace only
        wait_s = self.call_timeout_s if failed is None else min(self.call_timeout_s, 10.0)
        before = len(lost)
        self._wait(calls, lost, "collective weight push", wait_s, broke=failed)
        if failed is not None or len(lost) > before:
            self._drop_group()

    def _form_group(self, members: tuple) -> tuple:
        """A new collective group of this process (rank 0) and `members` (ranks 1..), after a liveness check that
        replaces the dead ones (so no rank is awaited in vain); the members it was formed with."""
        import ray

        from credo.distributed.ray.collective import master_store, open_group

        self._drop_group()
        alive = {h.ready.remote(): (s, h) for s, h in members}
        ready, late = ray.wait(list(alive), num_returns=len(alive), timeout=self.call_timeout_s)
        for r in ready:
            try:
                ray.get(r)
            except loss_errors() as e:
                self._lost(*alive[r], e)
        for r in late:
            self._lost(*alive[r], f"did not answer within cluster.call_timeout_s = {self.call_timeout_s} s")
        members = tuple((s, self.group.handles[s]) for s, _ in members)
        host = ray.util.get_node_ip_address()
        world = len(members) + 1
        store = master_store(host, world, self.call_timeout_s)
        joins = [h.join_group.remote(self.transport, host, store.port, rank, world, self.call_timeout_s)
                 for rank, (_, h) in enumerate(members, start=1)]
        try:
            group = open_group(self.transport, host, store.port, 0, world, self.call_timeout_s, store=store)
            ray.get(joins, timeout=self.call_timeout_s)
        except Exception as e:
            raise ClusterWorkerError(f"role '{self.role}': the {self.transport} group of the trainer and {len(members)} "
                                     f"worker(s) was not formed within cluster.call_timeout_s = {self.call_timeout_s} s: "
                                     f"{user_error(e)}") from None
        self._coll, self._coll_members = group, members
        self.groups_formed += 1
        return members

    def _drop_group(self) -> None:
        self._coll, self._coll_members = None, ()

    # ------------------------------------------------------------------------------------ elastic capacity
    def add_worker(self) -> int:
        """A worker joins (ROSE: an opportunistic device); it gets the current weights before any shard. Its slot."""
        with self._lock:
            if self.elastic and len(self.active) >= self.elastic[1]:
                raise ValueError(f"role '{self.role}' already has {len(self.active)} workers, elastic max {self.elastic[1]}")
        slot = self.group.start(1)[0]
        if self.pushed:
            self._push_full(self.group.handles[slot])
        with self._lock:
            self.active.append(slot)
        return slot

    def remove_worker(self, slot: int | None = None) -> int:
        """A worker leaves (the newest if `slot` is None), even mid-call: its unfinished shard is redone elsewhere."""
        with self._lock:
            floor = self.elastic[0] if self.elastic else 1
            if len(self.active) - 1 < max(floor, 1):
                raise ValueError(f"role '{self.role}' cannot drop below {max(floor, 1)} worker(s)")
            slot = self.active[-1] if slot is None else slot
            if slot not in self.active:
                raise ValueError(f"role '{self.role}' has no worker in slot {slot} (slots: {self.active})")
            self.leaving.add(slot)
            self.active.remove(slot)
        self.group.remove(slot)
        return slot

    def set_capacity(self, n: int) -> None:
        """Add or remove workers until there are `n`."""
        while len(self.active) < n:
            self.add_worker()
        while len(self.active) > n:
            self.remove_worker()

    # ------------------------------------------------------------------------------------ introspection
    def worker_info(self) -> dict[int, dict]:
        """slot -> where the worker runs (node id, pid, threads)."""
        return {s: self.group.info[s] for s in self.active}

    def digests(self) -> dict[int, str]:
        """slot -> sha256 of the worker's pushed weights."""
        import ray

        return dict(zip(self.active, ray.get([self.group.handles[s].digest.remote() for s in self.active],
                                             timeout=self.call_timeout_s)))

    def metrics(self) -> dict:
        """`cluster/<role>_*` since the last call: workers, busy_frac, queue_depth, restarts, the last push's bytes,
        and with a collective transport the groups formed (one, plus one per change of the pool's members)."""
        redone, self.redone_shards = self.redone_shards, 0
        out = {**self.group.stats.read(len(self.active)), f"cluster/{self.role}_redone_shards": redone,
               **self.sync_metrics}
        if self.transport != "object_store":
            out[f"cluster/{self.role}_groups_formed"], self.groups_formed = self.groups_formed, 0
        return out

    def close(self) -> None:
        self._drop_group()
        self.group.close()
        self.active = []
