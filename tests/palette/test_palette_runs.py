"""Reasoning Palette end to end: a tiny run through recipes/palette.yaml, exact resume after SIGKILL (the VAE in
the checkpoint), steering with `credo palette`, and the switch-off leaving a run bit-identical."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.common import REPO, read_rows, run_cli, tiny_overrides
from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

PALETTE = {"task.kwargs": "{digits: 1}", "palette.latent_dim": 2, "palette.prefix_len": 2, "palette.hidden_size": 16,
           "palette.vae_steps": 3, "palette.sft_steps": 3, "palette.batch_size": 8, "rollout.max_new_tokens": 6}


def args_for(out: Path, recipe: str = "palette", **extra) -> list[str]:
    o = {**PALETTE, "run.eval_every": 0, "run.steps": 2}
    o.update(extra)
    return ["run", f"recipes/{recipe}.yaml", *tiny_overrides(out, **o)]


def dump(out: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def test_a_run_samples_a_latent_per_response_and_trains_on_its_prefix(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(args_for(out, **{"run.dump_rollouts_every": 1, "run.eval_every": 2, "run.save_every": 2}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "palette vae: step 3/3" in proc.stderr and "palette sft: step 3/3" in proc.stderr
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert 0 < r["palette/distinct_frac"] <= 1 and r["palette/strategy_entropy"] >= 0
        # the trainer's pi_old scores each response under the prefix the engine read: no mismatch beyond rounding
        assert r["mismatch/k3"] < 1e-8 and r["train/grad_norm"] > 0
    for step in (1, 2):
        rows = dump(out, step)
        z = [tuple(d["meta"]["latent_z"]) for d in rows]
        assert len(z) == 16 and all(len(v) == 2 for v in z) and len(set(z)) == 16  # each response its own z
    ckpt = out / "checkpoints" / "step_00000002"
    vae = torch.load(ckpt / "source" / "rank0.pt", weights_only=True)["vae"]
    meta = json.loads((ckpt / "meta.json").read_text())
    warm = torch.load(Path(meta["policy_path"]) / "palette_vae.pt", weights_only=True)["state"]
    assert vae.keys() == warm.keys() and all(torch.equal(vae[k], warm[k]) for k in vae)  # frozen during RL, saved
    assert "+palette:" in meta["sft_key"]  # a resume is checked against both warm-ups
    # steering: `credo palette` with a fixed z, greedy: the same completion for every sample
    base = [sys.executable, "-m", "credo.cli", "palette", str(out), "--prompt", "3+4=", "--samples", "3",
            "--temperature", "0", "--max-new-tokens", "6"]
    a = subprocess.run(base + ["--z", "2.0,-2.0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr[-2000:]
    lines = [json.loads(x) for x in a.stdout.splitlines()]
    assert len(lines) == 3 and all(x["z"] == [2.0, -2.0] for x in lines)
    assert len({x["completion"] for x in lines}) == 1
    bad = subprocess.run(base + ["--z", "1,2,3"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--z has 3 numbers, expected latent_dim = 2" in bad.stderr


def test_sigkill_resume_is_exact(tmp_path):
    """Killed right after the step-2 checkpoint and resumed: metrics and weights equal the uninterrupted run."""
    extra = {"run.steps": 4, "run.save_every": 2, "run.keep_last": 3, "run.eval_every": 2,
             "reward.function": "tests.reliability.rewards:slow_starts_with_digit"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    wait_ok(start(args_for(full, **extra), tmp_path / "full.log"))
    run_and_kill(args_for(killed, **extra), has_checkpoint(killed, 2), tmp_path / "killed.log")
    assert not (killed / "checkpoints" / "step_00000004").exists()
    err = wait_ok(start(args_for(killed, **extra, **{"run.resume": "auto"}), tmp_path / "resumed.log"))
    assert "resumed from" in err and "palette: reusing cached warm-up" in err
    assert_same_run(full, killed, 4)


def test_switched_off_the_run_is_the_plain_one(tmp_path):
    """palette.enabled: false with diversity_metrics: the same run as without the section, plus palette/* keys."""
    plain, measured = tmp_path / "plain", tmp_path / "measured"
    o = {"palette.enabled": "false"}
    assert run_cli(args_for(plain, **o)).returncode == 0
    assert run_cli(args_for(measured, **o, **{"palette.diversity_metrics": "true"})).returncode == 0
    a, b = read_rows(plain), read_rows(measured)
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith("perf/")} == \
            {k: v for k, v in y.items() if not k.startswith(("perf/", "palette/"))}
        assert "palette/distinct_frac" in y and "palette/distinct_frac" not in x
