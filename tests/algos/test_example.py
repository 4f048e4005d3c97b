"""The documented plain-PyTorch example runs and its reward rises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plain_pytorch_loop.py"


def test_plain_pytorch_loop_reward_rises():
    spec = importlib.util.spec_from_file_location("plain_pytorch_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    history = module.main(steps=15, seed=0)
    first, last = sum(history[:4]) / 4, sum(history[-4:]) / 4
    # chance level is 1/V = 0.125; a broken loss or sign error stays there or falls
    assert first < 0.3 and last > first + 0.3, history
