"""`algo.old_log_probs` at plan time (credo/old_log_probs.py): the default adds nothing; `rollout` warns where the
sampler and the trainer can differ, refuses what it makes a no-op naming both keys, and `credo check` prints it."""

from __future__ import annotations

import pytest

from credo.config import load_recipe
from credo.errors import ConfigError
from credo.plan import resolve_plan

QUICK = "recipes/quickstart.yaml"
ROLLOUT = "algo.old_log_probs=rollout"


def warnings_of(*overrides) -> list[str]:
    return [n for n in resolve_plan(load_recipe(QUICK, list(overrides))).notes if "algo.old_log_probs" in n]


def test_the_default_and_a_matching_sampler_add_no_warning():
    assert load_recipe(QUICK).algo.old_log_probs == "recompute"
    assert warnings_of() == []
    assert warnings_of("rollout.backend=vllm", "rollout.dtype=bfloat16") == []  # recompute: nothing to warn of
    assert warnings_of(ROLLOUT) == []
    assert warnings_of(ROLLOUT, "model.dtype=bfloat16", "rollout.dtype=bfloat16") == []  # same dtype as the trainer
    assert warnings_of(ROLLOUT, "rollout.top_p=0.9", "rollout.kept_set_replay=true") == []


@pytest.mark.parametrize("overrides, says", [
    (["rollout.dtype=bfloat16"], "rollout.dtype 'bfloat16' differs from model.dtype 'float32'"),
    (["rollout.fp8_weights=true"], "rollout.fp8_weights"),
    (["rollout.backend=vllm"], "rollout.backend 'vllm'"),
    (["rollout.top_p=0.9"], "kept_set_replay is off"),
])
def test_a_sampler_that_can_differ_is_a_warning(overrides, says):
    notes = warnings_of(ROLLOUT, *overrides)
    assert len(notes) == 1 and notes[0].startswith("warning: ") and says in notes[0] and "mismatch/*" in notes[0]


@pytest.mark.parametrize("overrides, other", [
    (["algo.loss_kwargs={correction: tis}"], "algo.loss_kwargs.correction"),
    (["algo.loss_kwargs={correction: mis}"], "algo.loss_kwargs.correction"),
    (["algo.policy_loss=ipa"], "algo.policy_loss"),
    (["algo.policy_loss=mipu"], "algo.policy_loss"),
])
def test_a_part_that_pi_old_equal_to_mu_makes_a_no_op_is_refused(overrides, other):
    resolve_plan(load_recipe(QUICK, overrides))  # fine with the recompute
    with pytest.raises(ConfigError, match=rf"config keys 'algo.old_log_probs' and '{other}' cannot be used together"):
        resolve_plan(load_recipe(QUICK, [ROLLOUT, *overrides]))


def test_an_unknown_value_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="algo.old_log_probs"):
        load_recipe(QUICK, ["algo.old_log_probs=bypass"])


def test_the_async_warning_is_not_given_when_the_ratio_is_against_the_sampler():
    lag = ["stages.schedule=fixed_lag", "stages.schedule_kwargs={max_staleness: 1}"]
    assert any("ignores the behaviour policy" in n for n in resolve_plan(load_recipe(QUICK, lag)).notes)
    assert not any("ignores the behaviour policy" in n for n in resolve_plan(load_recipe(QUICK, [*lag, ROLLOUT])).notes)


def test_credo_check_prints_the_warning(capsys, tmp_path):
    from credo.cli import main

    rc = main(["check", QUICK, ROLLOUT, "rollout.dtype=bfloat16", f"run.output_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert any(line.startswith("credo: warning: algo.old_log_probs 'rollout'") for line in out.splitlines()), out
