"""`RayTeacher`: the distillation teacher (distill.placement: ray) on `cluster.teacher.workers` Ray actors.

    teacher = RayTeacher(folder, workers=2, resources={"CPU": 1}, dtype="float32", rows=256, chunk_size=1024, threads=1)
    log_probs = teacher(input_ids, attention_mask, mask)     # [B, L-1] float32, as `TeacherScorer` returns them

Each actor loads the teacher's folder in `dtype` and holds a `TeacherScorer` (credo.families.distill.teacher). A call
cuts the batch's rows into shards whose bounds are multiples of `rows` (one shard per actor at most) and each actor
scores its shard in row chunks of `rows`: the chunks, and so every forward, are the ones the trainer's scorer runs,
so the log-probs are bitwise the same on the same kind of device and thread count. The teacher is frozen (no
state, no weight push), so a lost actor (killed, crashed, its node gone) or one that runs past `call_timeout_s` is
replaced in its slot (`WorkerGroup.replace`, counted in `cluster/teacher_restarts`, at most `max_restarts` times over
the run) and its shard scored again by the replacement, with the same result.
"""

from __future__ import annotations

import os
import time

import torch

from credo.distributed.ray.runtime import ClusterWorkerError, WorkerGroup, loss_errors, user_error


class TeacherActor:
    """One teacher actor (made a Ray actor by `WorkerGroup`): the teacher's folder loaded in `dtype`, on the GPU Ray
    gave it (or the CPU), frozen."""

    def __init__(self, folder: str, *, dtype: str, rows: int, chunk_size: int, threads: int):
        import ray

        from credo.families.distill.teacher import TeacherScorer
        from credo.models import check_vocab, load_causal_lm, load_tokenizer

        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu")
        model = load_causal_lm(folder, dtype)
        check_vocab(model, load_tokenizer(folder), folder)
        model = model.to(self.device).eval().requires_grad_(False)
        self.scorer = TeacherScorer(model, rows=rows, chunk_size=chunk_size, device=self.device)

    def ready(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "threads": torch.get_num_threads(), "device": str(self.device)}

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.scorer(input_ids, attention_mask, mask).cpu()


def shards(n_rows: int, rows: int, workers: int) -> list[range]:
    """Contiguous row ranges, at most `workers`, whose bounds are multiples of `rows` (whole scoring chunks)."""
    chunks = -(-n_rows // max(1, rows))
    n = min(chunks, workers)
    bounds = [min(n_rows, chunks * i // n * rows) for i in range(n + 1)] if n else [0]
    return [range(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class RayTeacher:
    """The teacher's log-probs from a pool of `TeacherActor`s (see the module docstring); the `TeacherScorer` call.

    Args:
        folder: the teacher's model folder; every actor loads it.
        workers: actors; resources: the Ray request of each ({CPU: 1}, {GPU: 1}).
        dtype: model.dtype; rows: scoring row chunk (algo.micro_batch_size); chunk_size: algo.logprob_chunk_size.
        threads: torch intra-op threads per actor (the trainer's count for bitwise parity on CPU).
        max_restarts, startup_timeout_s, call_timeout_s: as the other roles (cluster.teacher.max_restarts,
            cluster.startup_timeout_s, cluster.call_timeout_s).
    """

    def __init__(self, folder: str, *, workers: int = 1, resources: dict | None = None, dtype: str = "float32",
                 rows: int, chunk_size: int, threads: int = 1, max_restarts: int = 3, startup_timeout_s: float = 300.0,
                 call_timeout_s: float = 600.0, role: str = "teacher"):
        if workers < 1:
            raise ValueError(f"workers is {workers}, expected >= 1 (teacher actors)")
        self.role, self.rows, self.call_timeout_s = role, max(1, rows), call_timeout_s
        self.group = WorkerGroup(role, TeacherActor, args=(str(folder),),
                                 kwargs=dict(dtype=dtype, rows=self.rows, chunk_size=chunk_size, threads=threads),
                                 resources=resources or {"CPU": 1}, max_restarts=max_restarts,
                                 startup_timeout_s=startup_timeout_s)
        self.redone_shards = 0
        self.slots = self.group.start(workers)

    @classmethod
    def from_cluster(cls, cluster, folder: str, *, dtype: str, rows: int, chunk_size: int,
                     threads: int) -> "RayTeacher":
        """Built from the recipe's `cluster:` section (its teacher role); `threads` is used when
        cluster.teacher.threads is 0."""
        from credo.distributed.ray.config import resources_of

        tc = cluster.teacher
        return cls(folder, workers=tc.workers, resources=resources_of(tc), dtype=dtype, rows=rows,
                   chunk_size=chunk_size, threads=tc.threads or threads, max_restarts=tc.max_restarts,
                   startup_timeout_s=cluster.startup_timeout_s, call_timeout_s=cluster.call_timeout_s)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """As `TeacherScorer.__call__`: [B, L-1] float32 on the device of `mask`, 0 off the mask."""
        import ray

        self.group.check()
        out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        args = [t.detach().cpu() for t in (input_ids, attention_mask, mask)]
        todo = {slot: s for slot, s in zip(self.slots, shards(mask.shape[0], self.rows, len(self.slots)))
                if bool(args[2][s.start:s.stop].any())}
        while todo:
            calls = {}
            for slot, s in todo.items():
                handle = self.group.handles[slot]
                ref = handle.score.remote(*(a[s.start:s.stop].clone() for a in args))  # not the whole storage
                calls[ref] = (slot, handle, s)
            t0 = time.monotonic()
            ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=self.call_timeout_s)
            self.group.stats.busy((time.monotonic() - t0) * len(calls))  # worker-seconds, at most
            lost = [(calls[r], f"a call ran past cluster.call_timeout_s = {self.call_timeout_s} s") for r in late]
            todo = {}
            for r in ready:
                slot, handle, s = calls[r]
                try:
                    out[s.start:s.stop] = ray.get(r).to(out)
                except loss_errors() as e:
                    lost.append((calls[r], e))
                except Exception as e:  # the teacher's forward raised: it stops the step, as it would on the trainer
                    raise user_error(e) from None
            for (slot, handle, s), cause in lost:  # replaced (counted), and the shard scored again
                self.group.replace(slot, handle, cause)
                self.redone_shards += 1
                todo[slot] = s
        return out

    def worker_info(self) -> dict[int, dict]:
        """slot -> where the actor runs (node id, pid, threads, device)."""
        return {s: self.group.info[s] for s in self.slots}

    def metrics(self) -> dict:
        """`cluster/teacher_*` since the last call: workers, busy_frac, queue_depth, restarts, redone_shards."""
        redone, self.redone_shards = self.redone_shards, 0
        return {**self.group.stats.read(len(self.slots)), f"cluster/{self.role}_redone_shards": redone}

    def close(self) -> None:
        """Stop the actors (safe to call twice)."""
        self.group.close()
        self.slots = []


__all__ = ["ClusterWorkerError", "RayTeacher", "TeacherActor", "shards"]
