"""`algo.old_log_probs: rollout` (the sampler's log-probs as pi_old, no recompute forward) against a naive reference.

- the recompute fills pi_old from the sampler without a policy forward (counted), and the default still runs it;
- the Updater's loss of a single pass equals the naive PPO objective with pi_old = the samples' own log-probs,
  written from the `Sample` lists (not from the packed tensors); `mismatch/*` still measures the sampler's gap;
- on the hf backend in fp32 at step 1, sampler and trainer agree (tests/invariants/test_sampler_parity.py), so the
  losses under recompute and rollout agree to 1e-5;
- a sample without sampler log-probs is refused at the recompute, naming the key.
"""

from __future__ import annotations

import pytest
import torch

from credo.train import scoring
from credo.train.batch import pack_batch
from tests.invariants.common import components, fixed_batch, naive_loss

pytestmark = [pytest.mark.slow, pytest.mark.invariants]

LOSS = {"clip_low": 0.1, "clip_high": 0.3, "dual_clip": 2.0}
RECIPE = {"algo.old_log_probs": "rollout", "rollout.temperature": 0.7,
          "algo.loss_kwargs": "{clip_low: 0.1, clip_high: 0.3, dual_clip: 2.0}", "optim.grad_clip": 0.0}
NAIVE = dict(temperature=0.7, entropy_coef=0.0, kl_coef=0.0, agg_mode="token-mean", norm_len=4, dual_clip=2.0,
             clip_low=0.1, clip_high=0.3)


def sampler_old(batch) -> torch.Tensor:
    """[B, T] pi_old = each sample's own `rollout_log_probs`, placed by hand: label column p - 1 + k scores response
    token k (independent of `credo.train.batch.pack`)."""
    out = torch.zeros(batch.loss_mask.shape)
    for i, s in enumerate(batch.samples):
        p = len(s.prompt_ids)
        for k, lp in enumerate(s.rollout_log_probs):
            out[i, p - 1 + k] = lp
    return out


@pytest.fixture
def forwards(monkeypatch):
    """Counts the policy forwards of the scorer (every path of `recompute` goes through `policy_forward`)."""
    calls = []
    real = scoring.policy_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(scoring, "policy_forward", counted)
    return calls


@pytest.mark.parametrize("mode, expected", [("recompute", 1), ("rollout", 0)])
def test_the_recompute_forward_runs_only_under_recompute(forwards, mode, expected):
    with components(**{**RECIPE, "algo.old_log_probs": mode, "algo.mini_batches": 2}) as c:
        batch = fixed_batch(c)
        c.scorer.recompute(c.engine.module, batch)
    assert len(forwards) == expected
    m = batch.loss_mask
    gap = float((batch.old_log_probs - sampler_old(batch))[m].abs().max())
    # the fixed samples' log-probs are made up: only the rollout mode returns them
    assert (gap == 0.0) == (mode == "rollout"), gap


def test_the_update_loss_with_rollout_old_equals_the_naive_reference():
    with components(**RECIPE) as c:  # one mini-batch, one epoch: the update's forward runs the step's weights
        batch = fixed_batch(c)
        c.scorer.recompute(c.engine.module, batch)
        ref = fixed_batch(c)
        ref.old_log_probs = sampler_old(ref)
        want, terms = naive_loss(c.engine.module, ref, range(len(ref)), on_policy=False, **NAIVE)
        on_policy, _ = naive_loss(c.engine.module, ref, range(len(ref)), on_policy=True, **NAIVE)
        metrics, skipped = c.updater.update(batch)
    with components(**{**RECIPE, "algo.old_log_probs": "recompute"}) as c:
        recomputed, _ = c.updater.update(fixed_batch(c))
    assert skipped == 0
    assert metrics["train/pg_loss"] == pytest.approx(float(terms["pg"].detach()), rel=1e-5, abs=1e-7)
    # the made-up pi_old changes the loss: the test would see pi_old taken from the forward instead
    assert abs(float(on_policy.detach()) - float(want.detach())) > 1e-3
    # the mismatch metrics still compare the sampler with the trainer's own pre-update log-probs (made-up: far off),
    # the same numbers the default mode logs
    mismatch = {k: v for k, v in metrics.items() if k.startswith("mismatch/")}
    assert mismatch["mismatch/k3"] > 0.1
    assert mismatch == {k: v for k, v in recomputed.items() if k.startswith("mismatch/")}


def test_on_the_fp32_hf_sampler_rollout_and_recompute_agree_at_step_1():
    with components(**{**RECIPE, "algo.mini_batches": 2, "algo.old_log_probs": "recompute"}) as c:
        batch = c.source.rollout(1)
        c.reward(batch)
        pack_batch(batch, c.tokenizer.pad_token_id, overlong_filter=c.overlong_filter)
        c.advantage(batch)
        assert batch.loss_mask.sum() > 20 and batch.advantages.abs().sum() > 0
        model, m = c.engine.module, batch.loss_mask
        losses = {}
        for mode in ("recompute", "rollout"):
            batch.old_log_probs = None
            c.scorer.old_from_rollout = mode == "rollout"
            c.scorer.recompute(model, batch)
            lp, ent = c.scorer(model, batch.input_ids, batch.attention_mask, m, with_entropy=True)
            losses[mode], _, _ = c.objective(lp, ent, old_log_probs=batch.old_log_probs, advantages=batch.advantages,
                                             mask=m, rollout_log_probs=batch.rollout_log_probs, ref_log_probs=None,
                                             weights=None, global_tokens=m.sum(), global_seqs=(m.sum(-1) > 0).sum())
    assert float(losses["recompute"].detach()) == pytest.approx(float(losses["rollout"].detach()), abs=1e-5)


def test_a_sample_without_sampler_log_probs_is_refused(forwards):
    with components(**{**RECIPE, "algo.mini_batches": 2}) as c:
        batch = fixed_batch(c)
        batch.samples[3].rollout_log_probs = []
        with pytest.raises(ValueError, match=r"algo.old_log_probs = 'rollout'.*sample 3 of step 1"):
            c.scorer.recompute(c.engine.module, batch)
