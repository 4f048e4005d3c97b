"""The asynchronous recipe keys: ranges and combinations named at load, the warning `credo check` gives a loss that
ignores the behaviour policy, the `behaviour_ratio` keyword against the naive TOPR and CISPO, the staleness metrics
against a count by hand, and the staleness learning-rate factor."""

from __future__ import annotations

import re

import pytest
import torch

from credo import algos
from credo.config import ConfigError, load_recipe
from credo.distributed.rollout import Sample
from credo.preflight import async_warnings
from credo.train.batch import Batch
from credo.train.staleness import staleness_lr_factor, staleness_metrics
from tests.algos._inputs import grad_of, make_policy_inputs
from tests.algos.naive_losses import cispo as naive_cispo
from tests.algos.naive_losses import topr as naive_topr

QUICK = "recipes/quickstart.yaml"


@pytest.mark.parametrize("override,message", [
    ("rollout.max_staleness=-1", "config key 'rollout.max_staleness' = -1 is out of range: expected >= 0"),
    ("rollout.async_mode=eager", "async_mode"),
    ("rollout.stale_policy=skip", "stale_policy"),
    ("optim.staleness_ref=0", "config key 'optim.staleness_ref' = 0 is out of range"),
])
def test_bad_values_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe(QUICK, [override], validate_names=False)


@pytest.mark.parametrize("overrides,key", [
    (["rollout.backend=vllm"], "'rollout.backend' = 'vllm'"),
    (["stages.rollout=multiturn", "env.id=credo:GuessNumber-v0", "stages.reward=env"], "'stages.rollout' = 'multiturn'"),
    (["engine.zero_stage=3"], "'engine.zero_stage' = 3"),
])
@pytest.mark.parametrize("schedule", [["stages.schedule=overlap"],
                                      ["rollout.max_staleness=1", "rollout.async_mode=overlap"]])  # the old keys
def test_overlap_refuses_what_its_workers_cannot_run(overrides, key, schedule):
    """Refused by the run plan (credo check), naming both keys, before any warm-up."""
    from credo.plan import resolve_plan

    with pytest.raises(ConfigError, match=r"^config keys .*overlap.* and " + re.escape(key) + ".* do not combine"):
        resolve_plan(load_recipe(QUICK, schedule + overrides))
    plan = resolve_plan(load_recipe(QUICK, ["rollout.async_mode=overlap"]))  # S = 0: no overlap, and a warning
    assert plan.schedule.name == "sync" and any("the run is synchronous" in n for n in plan.notes)


@pytest.mark.parametrize("loss,kwargs,warns", [
    ("ppo", "{}", True),                                  # GRPO's loss: ratio against the recomputed pi_old only
    ("ppo", "{correction: tis}", False),                  # decoupled PPO
    ("reinforce", "{correction: tis}", False),            # TIS
    ("ppo", "{correction: mis}", False),                  # MIS
    ("topr", "{}", True),
    ("topr", "{behaviour_ratio: true}", False),           # TOPR against mu, as ROLL runs it
    ("cispo", "{behaviour_ratio: true}", False),
    ("cispo", "{}", True),
    ("gspo", "{}", True),
    ("ipa", "{}", False),                                 # its kernel filters chunks by pi_old / mu
    ("mipu", "{}", False),                                # its kernel weights by pi_old / mu
])
def test_a_loss_that_ignores_the_behaviour_policy_is_warned_about_by_name(loss, kwargs, warns):
    r = load_recipe(QUICK, ["stages.schedule=fixed_lag", "stages.schedule_kwargs={max_staleness: 2}",
                            f"algo.policy_loss={loss}", f"algo.loss_kwargs={kwargs}"])
    notes = async_warnings(r, 2, "fixed_lag")
    assert bool(notes) == warns
    if warns:
        assert notes[0].startswith("warning: stages.schedule 'fixed_lag' with max_staleness = 2") and f"'{loss}'" in notes[0]
    assert async_warnings(load_recipe(QUICK, [f"algo.policy_loss={loss}", f"algo.loss_kwargs={kwargs}"]), 0) == []


def test_credo_check_prints_the_warning(tmp_path, monkeypatch, capsys):
    from credo.cli import main

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    assert main(["check", QUICK, "stages.schedule=fixed_lag", "run.output_dir=" + str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "credo: warning: stages.schedule 'fixed_lag' with max_staleness = 1 and algo.policy_loss 'ppo'" in out
    assert "credo check: OK" in out


@pytest.mark.parametrize("name,naive,kwargs", [
    ("topr", naive_topr, {}), ("topr", naive_topr, {"ratio_level": "sequence", "negative_weight": 0.7}),
    ("cispo", naive_cispo, {"clip_low": 0.2, "clip_high": 0.3}),
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_behaviour_ratio_is_the_loss_with_mu_in_place_of_pi_old(name, naive, kwargs, seed):
    g = torch.Generator().manual_seed(seed)
    lp, old, adv, mask, extra = make_policy_inputs(5, 7, g, rollout=True, log_ratio_scale=0.6)
    mu = extra["rollout_log_probs"]
    loss, _ = algos.POLICY_LOSSES[name](lp, old, adv, mask, rollout_log_probs=mu, behaviour_ratio=True, **kwargs)
    want = naive(lp, mu, adv, mask, **kwargs)  # the paper's loss, its ratio against the sampler's mu
    torch.testing.assert_close(loss, want.to(loss.dtype))
    torch.testing.assert_close(grad_of(loss, lp), grad_of(naive(lp, mu, adv, mask, **kwargs), lp))
    other, _ = algos.POLICY_LOSSES[name](lp, old, adv, mask, rollout_log_probs=mu, **kwargs)
    if kwargs.get("ratio_level") != "sequence":  # (a sequence ratio of 20 tokens is clipped to 1 either way)
        assert not torch.allclose(other, loss)  # without it the ratio is against pi_old: a different loss


def test_behaviour_ratio_needs_mu_and_no_correction():
    g = torch.Generator().manual_seed(0)
    lp, old, adv, mask, extra = make_policy_inputs(2, 3, g, rollout=True)
    with pytest.raises(ValueError, match="behaviour_ratio=True needs rollout_log_probs"):
        algos.POLICY_LOSSES["topr"](lp, old, adv, mask, behaviour_ratio=True)
    with pytest.raises(ValueError, match="correction='tis'"):
        algos.POLICY_LOSSES["topr"](lp, old, adv, mask, behaviour_ratio=True, correction="tis", **extra)


def _batch(step: int, versions: list[int]) -> Batch:
    samples = [Sample([1], [2], [1], [-0.5], True, policy_version=v) for v in versions]
    return Batch(samples=samples, problems=[None] * len(samples), group_ids=torch.zeros(len(samples)), step=step)


@pytest.mark.parametrize("step,versions,bound", [(5, [3, 3, 4, 2, 3], 2), (9, [0, 8, 5, 8], 3), (1, [0, 0], 1)])
def test_staleness_metrics_count_what_a_hand_count_gives(step, versions, bound):
    m = staleness_metrics(_batch(step, versions), bound)
    ages = [step - 1 - v for v in versions]
    assert m["async/staleness_mean"] == sum(ages) / len(ages)
    assert m["async/staleness_max"] == max(ages)
    for s in range(bound + 1):
        assert m[f"async/staleness_frac_{s}"] == ages.count(s) / len(ages)
    assert m["async/stale_frac"] == sum(a > bound for a in ages) / len(ages)
    assert sum(m[f"async/staleness_frac_{s}"] for s in range(bound + 1)) + m["async/stale_frac"] == 1.0


@pytest.mark.parametrize("S,ref,factor", [(0, 1, 1.0), (1, 1, 1.0), (2, 1, 0.5), (8, 1, 0.125), (8, 2, 0.25),
                                          (1, 4, 1.0)])
def test_staleness_lr_factor_falls_as_one_over_s_past_the_reference(S, ref, factor):
    assert staleness_lr_factor(S, ref) == factor
