"""The whole objective against a naive re-implementation: gradient before the optimizer step, and the
parameters after the Updater's real optimizer steps against hand-written AdamW.

Stages are built from the recipe (`credo.train.build.build`) with the entropy bonus, the KL term and
per-token weights all non-zero, off-policy old log-probs (so both PPO clip bounds and the dual clip are
active) and a sampling temperature other than 1. The reference lives in `tests/invariants/common.py`.
"""

from __future__ import annotations

import pytest
import torch

from credo.algos import AGG_MODES
from tests.invariants.common import (assert_same_update, components, fixed_batch, naive_grads, objective_grads,
                                     off_policy_fields, params_of, reference_update)

pytestmark = [pytest.mark.slow, pytest.mark.invariants]

LOSS = {"clip_low": 0.1, "clip_high": 0.3, "dual_clip": 2.0}
RECIPE = {"model.ref_model": True, "algo.entropy_coef": 0.05, "algo.kl_coef": 0.2, "rollout.temperature": 0.7,
          "algo.loss_kwargs": "{clip_low: 0.1, clip_high: 0.3, dual_clip: 2.0}", "optim.lr": 1e-2,
          "optim.grad_clip": 0.0}


def naive_args(agg_mode: str) -> dict:
    return dict(temperature=0.7, entropy_coef=0.05, kl_coef=0.2, agg_mode=agg_mode, norm_len=4, **LOSS)


def check_gradient(agg_mode: str, entropy_coef: float = 0.05):
    with components(**{**RECIPE, "algo.agg_mode": agg_mode, "algo.entropy_coef": entropy_coef}) as c:
        batch = fixed_batch(c, invalid=(5,))
        off_policy_fields(c, batch)
        loss, terms, grads = objective_grads(c, batch)
        ref_loss, ref_terms, ref_grads = naive_grads(c.engine.module, batch,
                                                     **{**naive_args(agg_mode), "entropy_coef": entropy_coef})
    # every term is live: the test would see a dropped or sign-flipped one
    assert abs(float(ref_terms["ent"].detach())) > 0.1 and abs(float(ref_terms["kl"].detach())) > 0.01
    assert float(terms["train/entropy"].detach()) == pytest.approx(float(ref_terms["ent"].detach()), rel=1e-5)
    assert float(terms["train/kl"].detach()) == pytest.approx(float(ref_terms["kl"].detach()), rel=1e-5)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-7)
    assert grads.keys() == ref_grads.keys()
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_gradient_of_the_objective_equals_autograd_on_the_naive_objective(agg_mode):
    check_gradient(agg_mode)


def test_gradient_with_an_entropy_coefficient_of_one():
    """A coefficient of exactly 1 still backpropagates the entropy (only 0 detaches it)."""
    check_gradient("token-mean", entropy_coef=1.0)


def check_one_update(agg_mode: str, **overrides):
    """One optimizer step of the Updater (2 micro-batches, DeepSpeed) = naive gradient + hand-written AdamW;
    the logged grad norm, loss and the micro-batch mean of `loss/ratio_mean` match the reference's."""
    with components(**RECIPE, **{"algo.agg_mode": agg_mode, "optim.weight_decay": 0.1, "optim.betas": "[0.8, 0.95]",
                                 "optim.warmup_steps": 2, **overrides}) as c:
        batch = fixed_batch(c, invalid=(5,))
        off_policy_fields(c, batch)
        before = params_of(c.engine.module)
        want, want_norm, want_losses = reference_update(
            c.engine.module, batch, lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1, grad_clip=0.0, warmup_steps=2,
            ppo_epochs=1, mini_batches=1, **naive_args(agg_mode))
        with torch.no_grad():
            lp, _ = c.scorer(c.engine.module, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=False)
        metrics, skipped = c.updater.update(batch)
        after = params_of(c.engine.module)
    assert skipped == 0 and metrics["train/skipped_steps"] == 0
    assert metrics["train/grad_norm"] == pytest.approx(want_norm, rel=1e-4)
    assert metrics["train/loss"] == pytest.approx(want_losses[0], rel=1e-5, abs=1e-7)
    # loss metrics are per-micro-batch values averaged over the micro-batches (here rows 0-7 and 8-15)
    means = []
    for rows in (range(0, 8), range(8, 16)):
        ratios = [float(torch.exp(lp[i, t] - batch.old_log_probs[i, t]))
                  for i in rows for t in range(lp.shape[1]) if batch.loss_mask[i, t]]
        means.append(sum(ratios) / len(ratios))
    assert metrics["loss/ratio_mean"] == pytest.approx(sum(means) / 2, rel=1e-5)
    assert_same_update(after, want, before)


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_one_update_equals_the_reference_adamw_step(agg_mode):
    check_one_update(agg_mode)


def test_one_update_on_zero0_equals_the_reference_and_reports_its_norm():
    """ZeRO-0: DeepSpeed reports no grad norm; the one the updater checks is logged instead."""
    check_one_update("token-mean", **{"optim.zero_stage": 0})


def test_non_finite_loss_skips_every_mini_batch(monkeypatch, caplog):
    """A NaN loss (the CREDO_FAULT_NAN_STEP hook) skips each mini-batch whole: nothing moves, each is
    counted and logged as a non-finite loss."""
    monkeypatch.setenv("CREDO_FAULT_NAN_STEP", "1")
    with components(**RECIPE, **{"algo.mini_batches": 2}) as c:
        batch = fixed_batch(c)
        assert batch.step == 1
        off_policy_fields(c, batch)
        before = params_of(c.engine.module)
        with caplog.at_level("ERROR", logger="credo"):
            metrics, skipped = c.updater.update(batch)
        after = params_of(c.engine.module)
    assert skipped == 2 and metrics["train/skipped_steps"] == 2
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [r.getMessage() for r in caplog.records] == ["step 1: optimizer step skipped, non-finite loss"] * 2


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_one_update_with_a_single_trained_token(agg_mode):
    """Only sample 0 (one response token) has a valid reward: the global counts are 1 token, 1 sequence.

    GRPO gives a lone sample advantage 0, so the entropy bonus and the KL term alone move the weights;
    a count clamped to more than 1, or a stray token of another sample, would change the step.
    """
    with components(**RECIPE, **{"algo.agg_mode": agg_mode, "optim.warmup_steps": 0}) as c:
        batch = fixed_batch(c, invalid=tuple(range(1, 16)))
        off_policy_fields(c, batch)
        assert int(batch.loss_mask.sum()) == 1
        before = params_of(c.engine.module)
        want, want_norm, _ = reference_update(c.engine.module, batch, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0,
                                              grad_clip=0.0, warmup_steps=0, ppo_epochs=1, mini_batches=1,
                                              **naive_args(agg_mode))
        metrics, skipped = c.updater.update(batch)
        after = params_of(c.engine.module)
    assert skipped == 0 and want_norm > 0
    assert metrics["train/grad_norm"] == pytest.approx(want_norm, rel=1e-4)
    assert_same_update(after, want, before)
