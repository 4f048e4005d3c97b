"""The Updater with token-budget micro-batches (`algo.micro_batch_tokens`), packed or padded, against the naive
reference of tests/invariants/common.py: the padded per-token objective of each mini-batch, autograd and a
hand-written AdamW step. The micro-batches vary in number from one mini-batch to the next, so DeepSpeed must be
told where each mini-batch ends: one optimizer step per mini-batch, each the reference's.
"""

from __future__ import annotations

import pytest
import torch

from credo.algos import AGG_MODES
from tests.invariants.common import (assert_same_update, components, fixed_batch, off_policy_fields, params_of,
                                     reference_update)
from tests.invariants.test_objective import RECIPE, naive_args

pytestmark = [pytest.mark.slow, pytest.mark.invariants]


def check_budget_update(agg_mode: str, packing: bool, budget: int = 20):
    with components(**RECIPE, **{"algo.agg_mode": agg_mode, "algo.mini_batches": 2, "optim.warmup_steps": 2,
                                 "algo.packing": packing, "algo.micro_batch_tokens": budget}) as c:
        batch = fixed_batch(c, invalid=(5,))
        off_policy_fields(c, batch)
        before = params_of(c.engine.module)
        want, want_norm, want_losses = reference_update(
            c.engine.module, batch, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, grad_clip=0.0, warmup_steps=2,
            ppo_epochs=1, mini_batches=2, **naive_args(agg_mode))
        counts = [len(c.updater.micro_batches(batch, mb)) for mb in torch.arange(len(batch)).tensor_split(2)]
        steps_before = c.engine.global_steps
        metrics, skipped = c.updater.update(batch)
        after = params_of(c.engine.module)
        steps = c.engine.global_steps - steps_before
    assert min(counts) >= 2, counts  # the budget splits each mini-batch
    assert skipped == 0 and steps == 2  # one optimizer step per mini-batch, however many micro-batches
    assert metrics["train/grad_norm"] == pytest.approx(want_norm, rel=1e-4)
    assert metrics["train/loss"] == pytest.approx(sum(want_losses) / 2, rel=1e-5, abs=1e-7)
    assert_same_update(after, want, before)
    return counts


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_packed_token_budget_update_equals_the_reference(agg_mode):
    check_budget_update(agg_mode, packing=True)


def test_padded_token_budget_update_equals_the_reference_with_more_micro_batches():
    """Padded micro-batches count their padding against the budget, so the same budget needs more of them."""
    padded = check_budget_update("seq-mean-token-mean", packing=False)
    packed = check_budget_update("seq-mean-token-mean", packing=True)
    assert sum(padded) > sum(packed)
