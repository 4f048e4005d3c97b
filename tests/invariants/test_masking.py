"""Masking: samples whose reward failed, overlong-filtered samples and tokens outside the response
contribute exactly zero gradient.

Checked through the stages built from a recipe, with the entropy bonus and the KL term on (they see
every loss token, not only those with a non-zero advantage):

- a batch with failed-reward samples trains exactly as the same batch without them (Updater, DeepSpeed);
- garbage written into every field outside the loss mask (advantages, old/ref/rollout log-probs,
  weights: prompt tokens, padding, observation tokens, whole failed or overlong rows) leaves the
  gradient bit for bit the same;
- with `algo.overlong_filter`, changing the tokens of a truncated response changes no gradient.
"""

from __future__ import annotations

import pytest
import torch

from tests.invariants.common import (assert_same_update, components, fixed_batch, global_rows, objective_grads,
                                     off_policy_fields, params_of)

pytestmark = [pytest.mark.slow, pytest.mark.invariants]

RECIPE = {"model.ref_model": True, "algo.entropy_coef": 0.05, "algo.kl_coef": 0.2, "rollout.temperature": 0.7,
          "optim.lr": 1e-2}
INVALID = (2, 9)  # failed reward calls; 2 also holds an observation token


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_failed_reward_samples_train_as_if_absent(agg_mode):
    params, masks = {}, {}
    for name, kw in (("invalid", {"invalid": INVALID}), ("dropped", {"drop": INVALID})):
        with components(**RECIPE, **{"algo.agg_mode": agg_mode}) as c:
            before = params_of(c.engine.module)
            batch = fixed_batch(c, **kw)
            off_policy_fields(c, batch, rows=global_rows(drop=kw.get("drop", ())))
            masks[name] = batch.loss_mask
            _, skipped = c.updater.update(batch)
            assert skipped == 0
            params[name] = params_of(c.engine.module)
    assert_same_update(params["invalid"], params["dropped"], before, rel=1e-5)
    assert not masks["invalid"][list(INVALID)].any() and masks["invalid"].sum(-1).gt(0).sum() == 14


def _garbage(batch):
    """Large finite values everywhere outside the loss mask (NaN would be caught as non-finite)."""
    off = ~batch.loss_mask
    g = torch.Generator().manual_seed(7)
    for name, scale in (("advantages", 50.0), ("old_log_probs", 30.0), ("ref_log_probs", 30.0),
                        ("rollout_log_probs", 30.0), ("weights", 40.0)):
        t = getattr(batch, name).clone()
        t[off] = (torch.randn(int(off.sum()), generator=g) * scale).to(t.dtype)
        setattr(batch, name, t)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum"])
def test_nothing_outside_the_loss_mask_reaches_the_gradient(agg_mode):
    with components(**RECIPE, **{"algo.agg_mode": agg_mode, "algo.overlong_filter": True}) as c:
        batch = fixed_batch(c, invalid=INVALID)
        off_policy_fields(c, batch)
        resp = batch.response_mask
        # what the loss mask removes here: prompt and padding columns, an observation token inside a
        # response, the failed rows and the truncated rows (overlong filter)
        assert (resp & ~batch.loss_mask).any() and not batch.finished.all()
        assert not batch.loss_mask[~batch.finished].any()
        assert batch.finished[INVALID[0]] and not batch.loss_mask[list(INVALID)].any(), "a failed reward still trains"
        assert batch.loss_mask[batch.valid & batch.finished].sum(-1).gt(0).all()
        _, _, clean = objective_grads(c, batch)
        _garbage(batch)
        _, _, dirty = objective_grads(c, batch)
        assert clean.keys() == dirty.keys()
        for k in clean:
            assert torch.equal(clean[k], dirty[k]), f"{k}: a value outside the loss mask reached the gradient"

        # the tokens of a truncated response (its own rows) do not matter either
        cut = int((~batch.finished).nonzero()[0])
        ids = batch.input_ids.clone()
        ids[cut, batch.attention_mask[cut].bool()] = 3 + (ids[cut, batch.attention_mask[cut].bool()] * 7) % 120
        batch.input_ids = ids
        _, _, other = objective_grads(c, batch)
        for k in clean:
            torch.testing.assert_close(other[k], clean[k], rtol=1e-5, atol=1e-7, msg=lambda m: f"{k}: {m}")
