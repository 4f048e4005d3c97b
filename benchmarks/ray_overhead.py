"""Ray's overhead on the quickstart: step time with one Ray rollout worker against the in-process hf backend.

    python benchmarks/ray_overhead.py --steps 20 [recipe overrides...]

Builds four quickstart trainers side by side from the recipe (the SFT warm-up cached beforehand, not timed):
`local` (cluster.engine: local, today's in-process HFBackend), `ray` (cluster.engine: ray with one rollout worker:
full weight pushes, one RNG stream per call like the local backend, the same torch thread count; the reward stays in
threads, cluster.reward.workers: 0, unless --ray-rewards), `ray-delta` (the same with sparse delta pushes) and
`ray-gloo` (full pushes by a Gloo broadcast, cluster.sync_transport: gloo).
Each step runs on the four in turn (the order rotating), so a load that drifts on a shared machine hits them
alike; the ratios are medians of per-step ratios. Prints the median `perf/step_time_s`, `perf/rollout_s` and
`perf/sync_s` (over steps 2.., the killed step left out), the ray/local ratios, Ray's start-up time (ray.init, a
worker placed and its model loaded, each trainer's build and first step), with --kill-at the recovery time (the
worker SIGKILLed mid-rollout -> its replacement ready in the slot -> the step's end),
whether every metrics key but perf/* and cluster/* is bit-identical to the local run's, and per step the delta
push's changed fraction and bytes against a full push, for the fp32 wire (this recipe) and for a bf16 one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def build_trainer(recipe: str, out: Path, overrides: list[str]):
    from credo.config import load_recipe
    from credo.trainer import Trainer

    r = load_recipe(str(REPO / recipe), [f"run.output_dir={out}", "run.progress=false", "run.plot=false",
                                         "run.eval_every=0", "run.save_every=0", *overrides])
    return Trainer(r), r


MODES = {"local": None, "ray": ("full", "object_store"), "ray-delta": ("delta", "object_store"),
         "ray-gloo": ("full", "gloo")}
"""mode -> (cluster.sync, cluster.sync_transport) of its Ray trainer; None: the local engine."""


def ray_overrides(sync: str, transport: str, threads: int, ray_rewards: bool) -> list[str]:
    """cluster.engine: ray with one rollout worker that samples exactly as the local backend (one RNG stream)."""
    return ["cluster.engine=ray", "cluster.rollout.workers=1", "cluster.rollout.per_sample_seeds=false",
            f"cluster.rollout.threads={threads}", f"cluster.sync={sync}", f"cluster.sync_transport={transport}",
            "cluster.rollout.resources={CPU: 1}",
            f"cluster.reward.workers={2 if ray_rewards else 0}", "cluster.reward.resources={CPU: 0.5}",
            "cluster.env.workers=0", "cluster.judge.workers=0", "cluster.startup_timeout_s=1800"]


def sparsity_row(step: int, trainer, backend, last_bf16: dict) -> tuple[dict, dict]:
    """The delta push's stats of this step, and a bf16 delta against `last_bf16` measured on the side."""
    from credo.distributed.ray.weights import diff_state, wire_state

    now_bf16 = wire_state(trainer.engine.module, torch.bfloat16)
    d = diff_state(last_bf16, now_bf16)
    return ({"step": step, "bf16_changed_frac": d.changed / d.total, "bf16_delta_bytes": d.sent_bytes,
             "bf16_full_bytes": d.full_bytes, **backend.sync_metrics}, now_bf16)


def kill_mid_rollout(backend, recovery: dict) -> threading.Thread:
    """A thread that SIGKILLs the backend's worker once a shard is in flight, then waits for its replacement to be
    ready in the same slot (placed, model loaded, ready() answered: the group records its info only then; the full
    weights are pushed to it next, then its shard is redone); `recovery` gets the seconds from the kill to that."""
    def kill() -> None:
        while not backend.running:
            time.sleep(0.005)
        slot = backend.active[0]
        pid = backend.worker_info()[slot]["pid"]
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while backend.group.info.get(slot, {}).get("pid") == pid:
            time.sleep(0.005)
        recovery["kill_to_replacement_ready_s"] = time.perf_counter() - t0
        recovery["killed_at"] = t0

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def same_but_perf(a: list[dict], b: list[dict]) -> bool:
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("perf/", "cluster/"))} for r in rows]
    return json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/quickstart.yaml")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ray-rewards", action="store_true", help="the verifier on Ray reward tasks too")
    p.add_argument("--kill-at", type=int, default=0, help="SIGKILL the `ray` trainer's rollout worker mid-rollout at "
                   "this step (worker loss: its shard redone on a replacement, the metrics unchanged)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-ray-overhead-"))
    import ray

    from credo.distributed.ray.weights import wire_state

    warm, _ = build_trainer(args.recipe, tmp / "warm", args.overrides)  # the SFT warm-up, cached: not timed
    warm.close()
    t0 = time.perf_counter()
    os.environ.setdefault("RAY_worker_niceness", "0")  # as credo's own local Ray: workers not reniced
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="warning")
    init_s = time.perf_counter() - t0
    modes = tuple(MODES)
    trainers, backends, startups, build_s = {}, {}, [], {}
    threads = torch.get_num_threads()
    for mode in modes:
        extra = [] if mode == "local" else ray_overrides(*MODES[mode], threads, args.ray_rewards)
        t0 = time.perf_counter()
        trainers[mode], r = build_trainer(args.recipe, tmp / mode, [*args.overrides, *extra])
        build_s[mode] = time.perf_counter() - t0
        if mode != "local":
            backends[mode] = trainers[mode].source.backend
            startups.append(trainers[mode].c.cluster.rollout_start_s)
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    recovery: dict = {}
    sparsity, last_bf16 = [], wire_state(trainers["ray-delta"].engine.module, torch.bfloat16)
    try:
        for step in range(1, args.steps + 1):
            k = step % len(modes)
            for mode in modes[k:] + modes[:k]:  # rotate who goes first
                killer = kill_mid_rollout(backends["ray"], recovery) if mode == "ray" and step == args.kill_at else None
                rows[mode].append(trainers[mode].train_step(step))  # cluster/* from the run's own step hook
                if killer is not None:
                    killer.join()
                    recovery["kill_to_step_end_s"] = time.perf_counter() - recovery.pop("killed_at")
            sp, last_bf16 = sparsity_row(step, trainers["ray-delta"], backends["ray-delta"], last_bf16)
            sparsity.append(sp)
            print(f"step {step}: " + ", ".join(f"{m} {rows[m][-1]['perf/step_time_s']:.3f} s" for m in modes), flush=True)
    finally:
        for t in trainers.values():
            t.close()
        ray.shutdown()
    print(f"\nray.init: {init_s:.2f} s; one rollout worker placed and its model loaded: "
          f"{', '.join(f'{s:.2f}' for s in startups)} s")
    print("trainer built (warm-up cached): " + ", ".join(f"{m} {build_s[m]:.2f} s" for m in modes))
    print("first step: " + ", ".join(f"{m} {rows[m][0]['perf/step_time_s']:.2f} s" for m in modes))
    print(f"ray.init to the Ray trainer's first step done (init + its build + its first step): "
          f"{init_s + build_s['ray'] + rows['ray'][0]['perf/step_time_s']:.2f} s, against the local trainer's build + "
          f"first step {build_s['local'] + rows['local'][0]['perf/step_time_s']:.2f} s")
    # step 1 pays one-off costs (first generate, allocator); the step with the killed worker pays its recovery
    timed = [i for i in range(1, args.steps) if i != args.kill_at - 1]
    for key in ("perf/step_time_s", "perf/rollout_s", "perf/sync_s"):
        med = {m: statistics.median(rows[m][i][key] for i in timed) for m in modes}
        if key == "perf/sync_s":  # the local push is a no-op (the backend samples the trainer's module): no ratio
            print(f"{key:18s} " + " | ".join(f"{m} {med[m]:.4f} s" for m in modes))
            continue
        ratio = {m: statistics.median(rows[m][i][key] / rows["local"][i][key] for i in timed) for m in modes[1:]}
        print(f"{key:18s} local {med['local']:.4f} s | "
              + " | ".join(f"{m} {med[m]:.4f} s (x{ratio[m]:.3f})" for m in modes[1:]))
    if args.kill_at:
        row = rows["ray"][args.kill_at - 1]
        print(f"worker killed at step {args.kill_at}: cluster/worker_restarts {row['cluster/worker_restarts']}, "
              f"redone shards {row['cluster/rollout_redone_shards']}, step {row['perf/step_time_s']:.2f} s against "
              f"a median of {statistics.median(rows['ray'][i]['perf/step_time_s'] for i in timed):.2f} s; "
              + ", ".join(f"{k} {v:.2f}" for k, v in recovery.items()))
    for mode in modes[1:]:
        print(f"metrics keys but perf/* and cluster/* bit-identical, {mode} vs local: "
              f"{same_but_perf(rows['local'], rows[mode])}")
    print("\nstep  fp32 changed  fp32 delta/full bytes    bf16 changed  bf16 delta/full bytes")
    for s in sparsity:
        frac = s.get("cluster/rollout_sync_changed_frac", float("nan"))
        print(f"{s['step']:4d}  {frac:12.4f}  {s['cluster/rollout_sync_bytes']:>10d}/{s['cluster/rollout_sync_full_bytes']:<10d}"
              f"  {s['bf16_changed_frac']:12.4f}  {s['bf16_delta_bytes']:>10d}/{s['bf16_full_bytes']:<10d}")


if __name__ == "__main__":
    main()
