"""Helpers for the reliability tests: short recipes, runs killed from outside, and run comparisons."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from credo.distributed.engine import DIST_ENV_VARS
from tests.e2e.common import REPO, read_rows, tiny_overrides


def kill_recipe(out_dir, **extra) -> list[str]:
    """6 steps, a checkpoint every 2 steps, eval every 3; a slow reward keeps each step >= 0.2 s."""
    o = {"run.steps": 6, "run.save_every": 2, "run.eval_every": 3, "run.keep_last": 3, "run.plot": False,
         "reward.function": "tests.reliability.rewards:slow_starts_with_digit"}
    o.update(extra)
    return ["run", "recipes/quickstart.yaml"] + tiny_overrides(out_dir, **o)


def env(**extra) -> dict:
    """This environment for a child run, less the process-group variables an in-process Trainer set here."""
    base = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    return {**base, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def start(args: list[str], log: Path, **env_extra) -> subprocess.Popen:
    """Start `credo ARGS` in its own process group, stderr to the file `log` (a pipe could fill and block it)."""
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(**env_extra),
                             stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    p.log = Path(log)
    return p


def wait_ok(p: subprocess.Popen, timeout: float = 300) -> str:
    """Wait for a run started with `start`; fail with its stderr unless it exits 0. Returns stderr."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    err = p.log.read_text()
    assert p.returncode == 0, f"credo exited with {p.returncode}:\n{err[-4000:]}"
    return err


def run_cli_expecting_error(args: list[str], *, exit_code: int, message: str, timeout: float = 300,
                            **env_extra) -> str:
    """Run `credo ARGS`; assert it fails with `exit_code` and `message` as its last stderr line, no traceback."""
    p = subprocess.run([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(**env_extra),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == exit_code, f"exit code {p.returncode}, expected {exit_code}:\n{p.stderr[-4000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-4000:]
    assert p.stderr.strip().splitlines()[-1] == message, p.stderr[-4000:]
    return p.stderr


def run_and_kill(args: list[str], until, log: Path, timeout: float = 300, **env_extra) -> None:
    """Start `credo ARGS`, SIGKILL its process group as soon as `until()` is true; fail if it ends first."""
    p = start(args, log, **env_extra)
    deadline = time.monotonic() + timeout
    try:
        while not until():
            if p.poll() is not None:
                raise AssertionError(f"the run ended (exit {p.returncode}) before the kill point:\n"
                                     f"{p.log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the kill point")
            time.sleep(0.01)
    finally:
        # the whole group: vLLM's engine processes die with the trainer, as on a node failure
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def has_row(run_dir: Path, step: int):
    """True once metrics.jsonl holds the row of `step` (the file is read raw: a torn line is fine)."""
    path = Path(run_dir) / "metrics.jsonl"
    needle = f'{{"step": {step},'
    return lambda: path.exists() and needle in path.read_text()


def has_checkpoint(run_dir: Path, step: int):
    """True once the checkpoint folder of `step` exists (it appears by an atomic rename, so it is complete)."""
    path = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    return path.exists


def comparable_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without wall-clock keys (perf/*)."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in read_rows(run_dir)]


def final_params(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The module tensors of the checkpoint of `step` (DeepSpeed's model states, or FSDP2's DCP shards merged)."""
    from credo.export import checkpoint_state_dict

    return checkpoint_state_dict(Path(run_dir) / "checkpoints" / f"step_{step:08d}")


def assert_same_run(a: Path, b: Path, last_step: int) -> None:
    """metrics.jsonl (less perf/*) equal row by row, and final parameters equal bit for bit."""
    ra, rb = comparable_rows(a), comparable_rows(b)
    assert [r["step"] for r in rb] == [r["step"] for r in ra] == list(range(last_step + 1))
    for x, y in zip(ra, rb):  # compared as JSON text, so NaN equals NaN
        diff = {k: (x.get(k), y.get(k)) for k in sorted(x.keys() | y.keys()) if json.dumps(x.get(k)) != json.dumps(y.get(k))}
        assert not diff, f"step {x['step']} differs (uninterrupted, resumed): {diff}"
    pa, pb = final_params(a, last_step), final_params(b, last_step)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), f"parameter {k} differs after resume"
