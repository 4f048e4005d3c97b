"""Fast checks of the batch record the stages share: `pack` refuses inconsistent samples, `Batch.to`
moves every tensor field (to the meta device: the one other device a CPU-only machine has)."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.rollout import Sample
from credo.train.batch import Batch, pack
from tests.invariants.common import fixed_samples

pytestmark = pytest.mark.invariants


@pytest.mark.parametrize("sample", [
    Sample([5, 6], [7, 8, 9], [1, 1], [-0.1, -0.2, -0.3], True),      # response_mask too short
    Sample([5, 6], [7, 8, 9], [1, 1, 1], [-0.1, -0.2], True),         # rollout_log_probs too short
])
def test_pack_refuses_samples_whose_fields_disagree(sample):
    with pytest.raises(ValueError, match=r"^sample 1: response_mask has \d and rollout_log_probs \d entries for 3 "):
        pack([Sample([1], [2], [1], [-1.0], True), sample], pad_id=0)


def test_batch_to_moves_every_field():
    samples = fixed_samples(n=4)
    ids, attn, resp, rlp = pack(samples, pad_id=0)
    batch = Batch(samples=samples, problems=[None] * 4, group_ids=torch.arange(4))
    names = ("input_ids", "attention_mask", "response_mask", "loss_mask", "rollout_log_probs", "old_log_probs",
             "ref_log_probs", "values", "advantages", "weights")
    fields = {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "loss_mask": resp}
    for n in names:
        setattr(batch, n, fields.get(n, rlp + len(n)))
    batch.extras = {"probe/x": rlp * 2}
    meta = torch.device("meta")
    assert batch.to(meta) is batch
    for n in names:
        assert getattr(batch, n).device == meta, n
    assert batch.extras["probe/x"].device == meta
