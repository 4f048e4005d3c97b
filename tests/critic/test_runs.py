"""Tiny PPO and AsyPPO runs through the recipes, exact resume after SIGKILL with critics, and two processes.

Each run is the testbed recipe shrunk by `tiny_overrides` (a few seconds per step on CPU).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from credo.distributed.engine import _free_port
from tests.e2e.common import read_rows, run_cli, tiny_overrides
from tests.reliability.common import has_checkpoint, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

CRITIC_KEYS = ("critic/value_loss", "critic/vf_clipfrac", "critic/explained_variance", "critic/sigma_mean",
               "perf/critic_s", "perf/peak_rss_gb")


def recipe_args(recipe: str, out: Path, **extra) -> list[str]:
    o = {"run.steps": 2, "run.eval_every": 0, "critic.critic_only_steps": 1}
    o.update(extra)
    return ["run", f"recipes/{recipe}.yaml", *tiny_overrides(out, **o)]


@pytest.mark.parametrize("recipe", ["ppo", "asyppo"])
def test_two_steps_through_the_recipe(tmp_path, recipe):
    out = tmp_path / "run"
    proc = run_cli(recipe_args(recipe, out, **{"run.dump_rollouts_every": 1}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k in CRITIC_KEYS:
            assert k in r and math.isfinite(r[k]), (k, r)
    assert "train/loss" not in rows[0]  # step 1 trains only the critic (critic.critic_only_steps = 1)
    assert rows[1]["train/grad_norm"] > 0
    assert rows[0]["critic/value_loss"] > 0
    if recipe == "asyppo":
        for r in rows:  # floor(0.2 * N) of N loss tokens, N = 16 samples x <= 4 tokens
            assert 0.15 < r["asyppo/adv_masked_frac"] <= 0.2 and 0.15 < r["asyppo/entropy_filtered_frac"] <= 0.2
            assert r["critic/sigma_mean"] > 0
        assert rows[1]["train/entropy"] < rows[1]["train/entropy_unfiltered"]
    else:
        assert "asyppo/adv_masked_frac" not in rows[0] and rows[0]["critic/sigma_mean"] == 0
    # the dumped advantages are GAE's per-token values, not one number per sample
    dump = [json.loads(l) for l in (out / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    per_token = [d for d in dump if d["advantages"] and len(set(d["advantages"])) > 1]
    assert per_token, dump[:2]


def test_tiny_critics_whitening_and_kl_in_reward(tmp_path):
    """Critics smaller than the actor (critic.path: tiny), min aggregation, KL in the reward, whitened advantages."""
    out = tmp_path / "run"
    proc = run_cli(recipe_args("asyppo", out, **{
        "critic.critic_only_steps": 0, "critic.path": "tiny", "critic.tiny.num_layers": 1, "critic.tiny.hidden_size": 64,
        "critic.tiny.num_heads": 2, "critic.tiny.num_kv_heads": 1, "critic.whiten": "true", "critic.kl_in_reward": 0.05,
        "model.ref_model": "true", "critic.value_agg": "min", "run.dump_rollouts_every": 1}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(out)
    assert all(math.isfinite(r["critic/value_loss"]) and r["train/grad_norm"] > 0 for r in rows)
    for step in (1, 2):
        dump = [json.loads(l) for l in (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        adv = torch.tensor([a for d in dump if d["trained"] for a, m in zip(d["advantages"], d["response_mask"]) if m])
        assert abs(float(adv.mean())) < 1e-4 and abs(float(adv.std()) - 1) < 1e-3  # whitened over the loss tokens


def _critic_params(run_dir: Path, step: int, m: int) -> dict:
    path = run_dir / "checkpoints" / f"step_{step:08d}" / "advantage" / f"critic_{m}" / "state" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def test_sigkill_resume_with_critics_is_exact(tmp_path):
    """AsyPPO (2 critics, 2 critic epochs, 2 mini-batches, 2 PPO epochs) killed right after the step-2 checkpoint
    and resumed equals the uninterrupted run: metrics, actor and both critics bit for bit."""
    extra = {"run.steps": 4, "run.save_every": 2, "run.keep_last": 3, "critic.epochs": 2, "critic.mini_batches": 2,
             "algo.ppo_epochs": 2, "reward.function": "tests.reliability.rewards:slow_starts_with_digit"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    wait_ok(start(recipe_args("asyppo", full, **extra), tmp_path / "full.log"))
    run_and_kill(recipe_args("asyppo", killed, **extra), has_checkpoint(killed, 2), tmp_path / "killed.log")
    assert not (killed / "checkpoints" / "step_00000004").exists()
    err = wait_ok(start(recipe_args("asyppo", killed, **extra, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    assert "resumed from" in err
    rows = [r["step"] for r in read_rows(killed)]
    assert rows == [1, 2, 3, 4]
    a, b = read_rows(full), read_rows(killed)
    for x, y in zip(a, b):
        diff = {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys()
                if not k.startswith("perf/") and json.dumps(x.get(k)) != json.dumps(y.get(k))}
        assert not diff, f"step {x['step']}: {diff}"
    for m in (0, 1):
        pa, pb = _critic_params(full, 4, m), _critic_params(killed, 4, m)
        assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa), f"critic {m} differs"
    assert not all(torch.equal(_critic_params(full, 2, 0)[k], _critic_params(full, 4, 0)[k])
                   for k in _critic_params(full, 2, 0))  # the critics trained between the checkpoints


def test_two_processes_keep_actor_and_critics_identical(tmp_path):
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "credo.cli"]
    proc = run_cli(recipe_args("asyppo", out, **{"run.save_every": 2}), launcher=launcher)
    # both streams: one CI run saw rank 1 abort ("terminate called without an active exception") with nothing
    # else on stderr (2026-12-05, not reproduced in 15 reruns); stdout may say what it was doing
    assert proc.returncode == 0, "stdout:\n" + proc.stdout[-2000:] + "\nstderr:\n" + proc.stderr[-3000:]
    meta = json.loads((out / "checkpoints" / "step_00000002" / "meta.json").read_text())
    assert len(meta["param_digests"]) == 2 and len(set(meta["param_digests"])) == 1
    critics = meta["component_files"]["advantage"]["param_digests"]
    assert len(critics) == 2 and all(len(d) == 2 and d[0] == d[1] for d in critics)
    assert critics[0][0] != critics[1][0]  # two different mini-critics
    rows = read_rows(out)
    assert rows[1]["train/grad_norm"] > 0 and 0.15 < rows[1]["asyppo/adv_masked_frac"] <= 0.2


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_rollback_of_one_step_restores_the_critics(tmp_path, zero_stage):
    """TrainState's snapshot holds the critics: a rolled-back step trains again exactly as the first time."""
    from credo.config import load_recipe
    from credo.trainer import Trainer

    trainer = Trainer(load_recipe("recipes/asyppo.yaml", tiny_overrides(
        tmp_path / "run", **{"run.eval_every": 0, "optim.zero_stage": zero_stage, "critic.critic_only_steps": 0,
                             "critic.warmup_steps": 3})))
    try:
        trainer.train_step(1)
        critics = trainer.advantage.engines
        params = lambda: [{k: v.detach().clone() for k, v in e.module.state_dict().items()} for e in critics]
        before = params()
        snap = trainer.state.snapshot()
        row = trainer.train_step(2)
        assert any(not torch.equal(before[0][k], params()[0][k]) for k in before[0])
        trainer.state.restore(snap)
        restored = params()
        assert all(torch.equal(b[k], r[k]) for b, r in zip(before, restored) for k in b)
        again = trainer.train_step(2)
        assert {k: v for k, v in again.items() if not k.startswith("perf/")} == \
            {k: v for k, v in row.items() if not k.startswith("perf/")}
    finally:
        trainer.close()
