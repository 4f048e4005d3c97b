"""Issue 57 A.7: `sft.micro_batch_tokens` runs a warm-up step in length-sorted passes. It must train the same thing
(the gradient of the batch's token-mean NLL, checked against a per-row reference), leave the keys of the warm-ups
cached before it existed unchanged when off, and cut the padded work (what cut the long-tail warm-up)."""

from __future__ import annotations

import random
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from credo.config import load_recipe
from credo.sft import backward_batch, micro_batches, sft_digest
from credo.warmup_estimate import flops_per_step, sft_step_flops


def test_passes_cover_every_row_once_within_the_token_budget():
    rng = random.Random(3)
    lengths = [rng.randint(5, 300) for _ in range(64)]
    groups = micro_batches(lengths, 1024)
    assert sorted(i for g in groups for i in g) == list(range(64))
    for g in groups:
        longest = max(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * longest <= 1024
        assert lengths[g[0]] == longest  # longest first: a pass is padded to its first row
    assert micro_batches(lengths, 0) == [list(range(64))]  # off: one pass, in batch order
    assert micro_batches([400, 10], 100) == [[0], [1]]  # a row past the budget goes alone


class _CausalToy(torch.nn.Module):
    """A causal LM in miniature (each position reads the mean of the embeddings up to it), with the interface
    backward_batch calls: model(input_ids=[B, L], attention_mask=[B, L]).logits [B, L, V]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32)

    def forward(self, input_ids, attention_mask):
        h = (self.emb(input_ids) * attention_mask[..., None]).cumsum(1)
        h = h / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
        return SimpleNamespace(logits=self.out(torch.tanh(h)))


def _pairs(n: int, seed: int = 0):
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        p, a = rng.randint(2, 6), rng.randint(1, 30)
        ids = [rng.randrange(1, 32) for _ in range(p + a)]
        pairs.append((ids, [0] * p + [1] * a))
    return pairs


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_micro_batches_give_the_batch_gradient_of_a_per_row_reference():
    model, pairs = _CausalToy(), _pairs(12)
    # reference: each row alone, unpadded; the sum of its answer tokens' NLL over the batch's answer-token count
    total = sum(sum(m[1:]) for _, m in pairs)
    model.zero_grad()
    ref_loss = 0.0
    for ids, m in pairs:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1], -1)
        nll = -logp.gather(1, x[0, 1:, None])[:, 0]
        row = (nll * torch.tensor(m[1:], dtype=nll.dtype)).sum() / total
        row.backward()
        ref_loss += row.item()
    ref = _grads(model)
    for budget in (0, 40, 100):
        model.zero_grad()
        loss, passes = backward_batch(model, pairs, budget, pad_id=0)
        assert loss.item() == pytest.approx(ref_loss, rel=1e-5)  # float32: other summation orders
        for g, r in zip(_grads(model), ref):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
        assert sum(rows for rows, _ in passes) == len(pairs)
        assert (len(passes) == 1) == (budget == 0)


def test_off_it_stays_out_of_the_warm_up_key_on_it_enters():
    r = load_recipe("recipes/quickstart.yaml")
    later = ("micro_batch_tokens", "mask_observations")  # fields added later, each out of the key while off
    before = {k: v for k, v in asdict(r.sft).items() if k not in later}
    assert sft_digest(r) == before  # the dict the key hashed before the fields existed: cached warm-ups still match
    r.sft.micro_batch_tokens = 2048
    assert sft_digest(r) == {**before, "micro_batch_tokens": 2048}


def test_the_cost_model_counts_the_passes_padding():
    shape = {"layers": 2, "h": 64, "h_kv": 32, "i": 192, "V": 128}
    rng = random.Random(0)
    lengths = [rng.choice([20, 30, 40, 300]) for _ in range(256)]
    one_pass = sft_step_flops(shape, lengths, 64)
    assert one_pass == pytest.approx(flops_per_step(shape, 64, 300), rel=0.01)  # 64 draws: a 300 in every batch
    assert sft_step_flops(shape, lengths, 64, micro_batch_tokens=2048) < one_pass / 2.5
