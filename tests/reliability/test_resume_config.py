"""Resume refuses changed settings (listing them), accepts them when told, and never overwrites the record
of a run it could not resume."""

from __future__ import annotations

import json

import pytest

from credo.config import ConfigError, load_recipe
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = pytest.mark.slow


def _train(out, **extra):
    from credo.trainer import train

    return train(load_recipe("recipes/quickstart.yaml", tiny_overrides(out, **{
        "run.eval_every": 0, "run.save_every": 2, **extra})))


def test_resume_with_changed_settings_is_refused_then_accepted_when_allowed(tmp_path):
    out = tmp_path / "run"
    _train(out, **{"run.steps": 2})
    config_before = (out / "config.yaml").read_text()
    with pytest.raises(ConfigError) as e:
        _train(out, **{"run.steps": 3, "run.resume": "auto", "optim.lr": 0.01, "algo.policy_loss": "cispo"})
    msg = str(e.value)
    assert "algo.policy_loss: 'ppo' -> 'cispo'" in msg and "optim.lr: 0.001 -> 0.01" in msg
    assert "run.steps" not in msg and "run.resume" not in msg
    assert [r["step"] for r in read_rows(out)] == [1, 2], "a refused resume must not touch the run"

    _train(out, **{"run.steps": 3, "run.resume": "auto", "optim.lr": 0.01, "algo.policy_loss": "cispo",
                   "run.allow_config_change": True})
    assert [r["step"] for r in read_rows(out)] == [1, 2, 3]
    assert (out / "config.yaml").read_text() == config_before
    applied = (out / "config.resume-2.yaml").read_text()
    assert "policy_loss: cispo" in applied and "lr: 0.01" in applied


def test_resume_with_every_checkpoint_corrupt_moves_the_old_metrics_aside(tmp_path):
    out = tmp_path / "run"
    _train(out, **{"run.steps": 2})
    old_rows = read_rows(out)
    for ckpt in (out / "checkpoints").glob("step_*"):
        victim = max((p for p in ckpt.rglob("*.pt")), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    _train(out, **{"run.steps": 2, "run.resume": "auto"})
    assert [r["step"] for r in read_rows(out)] == [1, 2]  # a fresh start, logged anew
    aside = out / "metrics.before-restart.jsonl"
    assert [json.loads(x) for x in aside.read_text().splitlines()] == old_rows
