"""A resume with run.allow_config_change: every allowed change takes effect, and a change the checkpoint cannot
honour is refused.

- optimizer settings that DeepSpeed restores from the checkpoint (optim.lr, betas, weight_decay): the resumed run
  trains with the new ones (before the fix, `train/lr` stayed at the checkpoint's rate);
- settings read when the run is built (the LR schedule, the policy loss's settings, the sampling): the new ones;
- settings that shape the checkpoint's weights and optimizer (model.dtype, model.tiny, engine.zero_stage, the critics'
  count): refused, even with allow_config_change, before anything trains.
"""

from __future__ import annotations

import pytest

from credo.config import load_recipe
from credo.errors import ConfigError
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = pytest.mark.slow


def recipe(out, **extra):
    return load_recipe("recipes/quickstart.yaml", tiny_overrides(out, **{
        "run.steps": 2, "run.save_every": 2, "run.eval_every": 0, "optim.warmup_steps": 0, "optim.lr": 1e-3,
        "run.plot": False, **extra}))


@pytest.fixture(scope="module")
def first_segment(tmp_path_factory):
    from credo.trainer import train

    out = tmp_path_factory.mktemp("resume-changes") / "run"
    train(recipe(out))
    return out


def resumed(out, **changes):
    from credo.trainer import Trainer

    return Trainer(recipe(out, **{"run.resume": "auto", "run.steps": 3, "run.allow_config_change": True, **changes}))


def test_an_allowed_change_of_the_optimizer_settings_takes_effect(first_segment, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(first_segment, out)
    trainer = resumed(out, **{"optim.lr": 3e-3, "optim.betas": "[0.8, 0.9]", "optim.weight_decay": 0.05,
                              "optim.lr_schedule": "linear", "optim.min_lr_ratio": 0.5})
    try:
        assert trainer.start_step == 2
        group = trainer.engine.optimizer.param_groups[0]
        assert (group["initial_lr"], group["betas"], group["weight_decay"]) == (3e-3, (0.8, 0.9), 0.05)
        assert trainer.engine.lr_scheduler.base_lrs == [3e-3]
        # the linear schedule of the new recipe over run.steps = 3 optimizer steps, at step 2: 3e-3 * (1 - 0.5 * 2/3)
        assert group["lr"] == pytest.approx(3e-3 * (1 - 0.5 * 2 / 3))
        trainer.fit()
    finally:
        trainer.close()
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # train/lr is logged after the step's scheduler tick: step 3 of 3 is the end of the linear decay, 0.5 x 3e-3
    assert rows[1]["train/lr"] == pytest.approx(1e-3) and rows[2]["train/lr"] == pytest.approx(3e-3 * 0.5)
    assert (out / "config.resume-2.yaml").exists()


@pytest.mark.parametrize("key, value", [("model.dtype", "bfloat16"), ("model.tiny.intermediate_size", 96),
                                        ("engine.zero_stage", 2)])
def test_a_change_the_checkpoint_cannot_honour_is_refused(first_segment, key, value):
    with pytest.raises(ConfigError, match=rf"(?s)shaped by:\n  {key}: .*cannot change on resume \(not even with "
                                          r"run.allow_config_change\)"):
        resumed(first_segment, **{key: value})
