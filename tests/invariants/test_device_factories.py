"""Device correctness without a GPU: a train step of the quickstart (under each engine), the multi-turn recipe and
AsyPPO (critics) run under `ExplicitDeviceMode`, and no tensor created by credo inside the step leaves its device to the default.

On a CPU-only machine a tensor made with `torch.ones(n)` next to CUDA log-probs cannot fail, so the bug the first
GPU run found (b38e148: the mismatch metrics made their mask on the CPU) is caught by its cause instead. The last
test puts that bug back (the function as it was before b38e148) and checks the mode names its line.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from credo.config import load_recipe
from credo.distributed.device_check import ExplicitDeviceMode, Violation
from tests.e2e.common import tiny_overrides

MULTITURN = {"stages.rollout": "multiturn", "stages.reward": "env", "stages.advantage": "turn_credit",
             "rollout.prompts_per_step": 2, "rollout.group_size": 2, "env.eval_episodes": 4,
             "env.id": "credo:GuessNumber-v0", "env.kwargs": "{low: 1, high: 7, max_turns: 3}", "env.max_turns": 3,
             "env.max_total_tokens": 64, "env.max_new_tokens_per_turn": 3,
             "stages.advantage_kwargs": "{credit: ipa, gamma: 0.9}", "algo.policy_loss": "ipa"}
RECIPES = {"quickstart": {}, "multiturn": MULTITURN, "asyppo": {"critic.critic_only_steps": 0},
           "quickstart-fsdp2": {"engine.backend": "fsdp2"}}


def _trainer(recipe: str, out, **extra):
    from credo.trainer import Trainer

    return Trainer(load_recipe(f"recipes/{recipe.split('-')[0]}.yaml", tiny_overrides(
        out / "run", **{"run.eval_every": 0, "run.steps": 2, **RECIPES[recipe], **extra})))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    t = _trainer("quickstart", tmp_path_factory.mktemp("device-qs"))
    yield t
    t.close()


def test_the_mode_sees_a_factory_without_device_and_passes_explicit_ones():
    with ExplicitDeviceMode() as mode:
        torch.ones(3, device="cpu")
        torch.zeros_like(torch.empty(2, device="cpu"))
        torch.empty(2, device="cpu").new_zeros(4)  # a method: takes its tensor's device
        torch.arange(3)  # this file is no credo code: not recorded
    assert mode.violations == []
    # credo code that names no device is recorded once per site, with its line
    from credo.algos import mismatch

    src = "def f(n):\n    return torch.ones(n)\n"
    ns = {"torch": torch}
    exec(compile(src, mismatch.__file__, "exec"), ns)  # a function whose code claims to be credo's
    with ExplicitDeviceMode() as mode:
        ns["f"](2), ns["f"](3)
    assert mode.violations == [Violation("ones", "credo/algos/mismatch.py", 2)]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_train_step_names_the_device_of_every_tensor_it_creates(recipe, tmp_path, quickstart):
    t = quickstart if recipe == "quickstart" else _trainer(recipe, tmp_path)
    try:
        t.train_step(1)  # first step outside: one-time set-up (caches, lazy imports) is not the step
        with ExplicitDeviceMode() as mode:
            row = t.train_step(2)
        assert not mode.violations, mode.report()
        assert math.isfinite(row["train/loss"])
    finally:
        if t is not quickstart:
            t.close()


def _mismatch_before_b38e148():
    """credo/train/mismatch.py's `step_mismatch_metrics` as it was before b38e148: the mask on the CPU."""
    import credo.train.mismatch as mm

    import re

    src = re.sub(r",\s*device=trainer\.device\)", ")", inspect.getsource(mm.step_mismatch_metrics))  # any line wrapping
    assert "torch.ones(1, trainer.numel(), dtype=torch.bool))" in src, "the planted bug no longer matches the code"
    ns = dict(vars(mm))
    exec(compile(src, mm.__file__, "exec"), ns)
    return ns["step_mismatch_metrics"]


def test_the_bug_of_b38e148_put_back_is_caught(quickstart, monkeypatch):
    import credo.train.update as update

    monkeypatch.setattr(update, "step_mismatch_metrics", _mismatch_before_b38e148())
    with ExplicitDeviceMode() as mode:
        row = quickstart.train_step(3)
    assert "mismatch/kl_k3" in row or any(k.startswith("mismatch/") for k in row), "the metrics must have run"
    assert [(v.func, v.file) for v in mode.violations] == [("ones", "credo/train/mismatch.py")], mode.report()
