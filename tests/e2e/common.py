"""Small, fast recipe overrides shared by the end-to-end tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

from credo.distributed.engine import DIST_ENV_VARS

REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(out_dir, **extra) -> list[str]:
    """A run of a few seconds per step: 1-layer tiny model, 5 SFT steps, 4 prompts x 4 samples."""
    o = {
        "run.output_dir": str(out_dir), "run.steps": 3, "run.eval_every": 3, "run.save_every": 0, "run.progress": False,
        "run.plot": True, "run.seed": 0, "run.threads": 1,
        "model.tiny.num_layers": 1, "model.tiny.hidden_size": 64, "model.tiny.num_heads": 2, "model.tiny.num_kv_heads": 1,
        "model.tiny.intermediate_size": 128,
        "task.eval_size": 16, "task.kwargs": "{max_operand: 9, ops: '+', fixed_width: true}",
        "sft.steps": 5, "sft.batch_size": 16,
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 4,
        "algo.micro_batch_size": 8, "optim.lr": 1e-3, "reward.function": "tests.e2e.rewards:starts_with_digit",
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def read_rows(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]


def run_cli(args: list[str], *, env_extra: dict | None = None, timeout: float = 600, launcher: list[str] | None = None):
    # an in-process Trainer in this pytest process sets RANK/MASTER_PORT...; a child must pick its own
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    env.update({"OMP_NUM_THREADS": "1", **(env_extra or {})})
    cmd = (launcher or [sys.executable, "-m", "credo.cli"]) + args
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
