"""Every recipe key that changes the update is exercised at a non-default value, and reaches the update.

One recipe sets all of them off their defaults at once. The Updater's parameters after the step (2
epochs x 2 mini-batches x 3 micro-batches, DeepSpeed) must equal the naive reference run with the
recipe's values (tests/invariants/common.py); then, key by key, the reference with that one key back at
its default must give a clearly different update. So each key's value reaches the loss (or the
optimizer), and a key that were dropped on its way there would fail this test.

| recipe key                       | value here              | tests that exercise it off its default              |
|----------------------------------|-------------------------|-----------------------------------------------------|
| algo.loss_kwargs: clip_low       | 0.1 (default 0.2)       | here; test_objective.py (0.1)                       |
| algo.loss_kwargs: clip_high      | 0.6 (default 0.2)       | here; test_objective.py (0.3)                       |
| algo.loss_kwargs: dual_clip      | 1.8 (default None)      | here; test_objective.py (2.0)                       |
| algo.entropy_coef                | 0.03 (default 0)        | here; test_objective.py, test_masking.py, DP test   |
| algo.kl_coef (model.ref_model)   | 0.3 (default 0)         | here; test_objective.py, test_masking.py, DP test   |
| rollout.temperature              | 1.3 (default 1.0)       | here; test_sampler_parity.py (0.7, 1.3)             |
| algo.agg_mode                    | seq-mean-token-sum-norm | here; test_objective.py, DP test (all four modes)   |
| algo.mini_batches                | 2 (default 1)           | here; test_sampler_parity.py (recompute path)       |
| algo.ppo_epochs                  | 2 (default 1)           | here                                                |
| algo.overlong_filter             | true (default false)    | here; test_masking.py                               |
| optim.grad_clip                  | 0.5 (default 1.0)       | here; DP test (1.0, active)                         |
| optim.lr / weight_decay / betas / warmup_steps | 1e-2 / 0.5 / [0.8, 0.95] / 3 | here; test_objective.py      |
| algo.micro_batch_size            | 3 (does not change the update: checked equal here) | here; DP test (4)         |
| algo.micro_batch_tokens, algo.packing | (do not change the update) | test_packing_update.py (equal to the reference) |
| algo.old_log_probs                | (rollout: pi_old = mu)  | test_old_log_probs.py (equal to the reference)      |
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from tests.invariants.common import (assert_same_update, components, fixed_batch, off_policy_fields, params_of,
                                     reference_update, update_error)

pytestmark = [pytest.mark.slow, pytest.mark.invariants]

RECIPE = {"algo.loss_kwargs": "{clip_low: 0.1, clip_high: 0.6, dual_clip: 1.8}", "algo.entropy_coef": 0.03,
          "algo.kl_coef": 0.3, "model.ref_model": True, "rollout.temperature": 1.3,
          "algo.agg_mode": "seq-mean-token-sum-norm", "algo.mini_batches": 2, "algo.ppo_epochs": 2,
          "algo.overlong_filter": True, "algo.micro_batch_size": 3, "optim.grad_clip": 0.5, "optim.lr": 1e-2,
          "optim.weight_decay": 0.5, "optim.betas": "[0.8, 0.95]", "optim.warmup_steps": 3}
# the same values, as the reference's arguments (norm_len = rollout.max_new_tokens of the tiny overrides)
REFERENCE = dict(clip_low=0.1, clip_high=0.6, dual_clip=1.8, entropy_coef=0.03, kl_coef=0.3, temperature=1.3,
                 agg_mode="seq-mean-token-sum-norm", norm_len=4, mini_batches=2, ppo_epochs=2, grad_clip=0.5,
                 lr=1e-2, weight_decay=0.5, betas=(0.8, 0.95), warmup_steps=3)
SEEN = 2e-2  # 20x the tolerance of the equality above: a key at its default must move the update this much
# recipe key -> (reference argument, its default in credo's config / the loss's signature)
DEFAULTS = {
    "algo.loss_kwargs: clip_low": ("clip_low", 0.2),
    "algo.loss_kwargs: clip_high": ("clip_high", 0.2),
    "algo.loss_kwargs: dual_clip": ("dual_clip", None),
    "algo.entropy_coef": ("entropy_coef", 0.0),
    "algo.kl_coef": ("kl_coef", 0.0),
    "rollout.temperature": ("temperature", 1.0),
    "algo.agg_mode": ("agg_mode", "token-mean"),
    "algo.mini_batches": ("mini_batches", 1),
    "algo.ppo_epochs": ("ppo_epochs", 1),
    "algo.overlong_filter": ("overlong_filter", False),
    "optim.grad_clip": ("grad_clip", 1.0),
    "optim.weight_decay": ("weight_decay", 0.0),
    "optim.warmup_steps": ("warmup_steps", 0),
}


@pytest.fixture(scope="module")
def step():
    with components(**RECIPE) as c:
        assert c.overlong_filter
        batch = fixed_batch(c, invalid=(5,))
        off_policy_fields(c, batch)
        unfiltered = fixed_batch(c, invalid=(5,), overlong_filter=False)
        off_policy_fields(c, unfiltered)
        model = copy.deepcopy(c.engine.module)
        before = params_of(model)
        metrics, skipped = c.updater.update(batch)
        after = params_of(c.engine.module)
    return SimpleNamespace(batch=batch, unfiltered=unfiltered, model=model, before=before, after=after,
                           metrics=metrics, skipped=skipped)


def test_update_with_every_key_off_default_equals_the_reference(step):
    want, norm, losses = reference_update(step.model, step.batch, **REFERENCE)
    assert step.skipped == 0 and len(losses) == 4
    assert step.metrics["train/grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert norm > REFERENCE["grad_clip"], "the clip must be active"
    assert step.metrics["train/loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-4, abs=1e-6)
    assert_same_update(step.after, want, step.before)


@pytest.mark.parametrize("key", list(DEFAULTS))
def test_key_reaches_the_update(step, key):
    arg, default = DEFAULTS[key]
    args = dict(REFERENCE)
    batch = step.batch
    if arg == "overlong_filter":
        batch = step.unfiltered
    else:
        args[arg] = default
    want, _, _ = reference_update(step.model, batch, **args)
    err, _, _ = update_error(step.after, want, step.before)
    print(f"{key}: {err:.3g}")
    assert err > SEEN, f"{key} back at its default changes the update by only {err:.3g} (relative L2)"
