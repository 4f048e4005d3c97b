"""Padding-free packing (credo.train.packing, `algo.packing`) against references written differently.

- The packed forward gives each sample the hidden states and log-probs it gets alone (no padding, no neighbours):
  Qwen2 and Llama, sdpa and eager attention, fp32.
- Loss and gradients of a ragged batch (prompts and responses of different lengths, an empty row, an observation
  token) are the same packed in token-budget micro-batches as padded in micro-batches of a sequence count, for
  every agg_mode, on the hidden-state path and the full-logits (ZeRO-3) path.
- The row and micro-batch splitters keep every sample once and within their budgets.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo import algos  # noqa: E402
from credo.config import AGG_MODES  # noqa: E402
from credo.distributed.rollout import Sample  # noqa: E402
from credo.train.batch import Batch, pack_batch  # noqa: E402
from credo.train.objective import Objective  # noqa: E402
from credo.train.packing import PackedRows, first_fit_rows, row_lengths, split_to, token_micro_batches  # noqa: E402
from credo.train.scoring import PolicyScorer  # noqa: E402

V = 48


def tiny(arch: str, attn: str = "sdpa", seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=64, max_position_embeddings=64, attn_implementation=attn)
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


def ragged_samples(n: int = 9, seed: int = 0) -> list[Sample]:
    """Prompts of 2-6 tokens, responses of 0-17: a long tail, an empty response, an observation token (mask 0)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 17, 1, 0, 8, 2, 12, 5, 1][:n]
    out = []
    for i, r in enumerate(lengths):
        prompt = torch.randint(3, V, (2 + i % 5,), generator=g).tolist()
        resp = torch.randint(3, V, (r,), generator=g).tolist()
        mask = [1] * r
        if r > 4:
            mask[2] = 0
        out.append(Sample(prompt, resp, mask, [-1.0] * r, finished=i % 3 != 0))
    return out


def ragged_batch(seed: int = 0) -> Batch:
    samples = ragged_samples(seed=seed)
    b = Batch(samples=samples, problems=[None] * len(samples), group_ids=torch.arange(len(samples)) // 3, step=1)
    g = torch.Generator().manual_seed(seed + 1)
    b.rewards, b.valid = torch.rand(len(samples), generator=g), torch.ones(len(samples), dtype=torch.bool)
    pack_batch(b, 0, overlong_filter=False)
    T = b.loss_mask.shape[1]
    b.advantages = torch.randn(len(samples), T, generator=g) * b.loss_mask
    b.old_log_probs = (-torch.rand(len(samples), T, generator=g) * 3) * b.loss_mask
    b.ref_log_probs = (-torch.rand(len(samples), T, generator=g) * 3) * b.loss_mask
    b.weights = (0.5 + torch.rand(len(samples), T, generator=g)) * b.loss_mask
    return b


@pytest.mark.parametrize("arch,attn", [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")])
def test_packed_hidden_states_are_each_samples_own(arch, attn):
    """Each sample run alone (no padding, batch of one) against the same sample inside packed rows."""
    model = tiny(arch, attn).eval()
    b = ragged_batch()
    packed = PackedRows.of(b.input_ids, b.attention_mask)
    assert packed.input_ids.shape[0] < len(b)  # several samples share a row
    with torch.no_grad():
        rows = model.model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                           use_cache=False).last_hidden_state.flatten(0, 1)
        for i, s in enumerate(b.samples):
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            alone = model.model(input_ids=ids).last_hidden_state[0]
            start = int(packed.starts[i])
            torch.testing.assert_close(rows[start:start + ids.shape[1]], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hidden_path", [True, False])
def test_packed_log_probs_and_entropy_equal_the_padded_ones(hidden_path):
    model = tiny("qwen2").eval()
    b = ragged_batch()
    padded = PolicyScorer(temperature=0.7, chunk_size=5, hidden_path=hidden_path, needs_old_log_probs=False)
    packed = PolicyScorer(temperature=0.7, chunk_size=5, hidden_path=hidden_path, needs_old_log_probs=False,
                          packed=True)
    with torch.no_grad():
        lp_a, ent_a = padded(model, b.input_ids, b.attention_mask, b.loss_mask, with_entropy=True)
        lp_b, ent_b = packed(model, b.input_ids, b.attention_mask, b.loss_mask, with_entropy=True)
    assert lp_b.shape == lp_a.shape and bool((lp_a != 0).any())
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-5)
    assert bool((lp_b[~b.loss_mask] == 0).all())


def _loss_and_grads(model, scorer, objective, batch, micros):
    """Sum of micro-batch losses (global counts) and the accumulated gradients, as the Updater forms them."""
    model.zero_grad(set_to_none=True)
    m = batch.loss_mask
    gt, gs = m.sum(), (m.sum(-1) > 0).sum()
    total = 0.0
    for rows in micros:
        lp, ent = scorer.update_forward(model, batch, rows)
        loss, _, _ = objective(lp, ent, old_log_probs=batch.old_log_probs[rows], advantages=batch.advantages[rows],
                               mask=m[rows], rollout_log_probs=batch.rollout_log_probs[rows],
                               ref_log_probs=batch.ref_log_probs[rows], weights=batch.weights[rows],
                               global_tokens=gt, global_seqs=gs)
        loss.backward()
        total += float(loss.detach())
    return total, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("hidden_path", [True, False])
def test_packed_token_budget_loss_and_gradients_equal_padded_ones(agg_mode, hidden_path):
    model = tiny("qwen2", seed=1)
    b = ragged_batch(seed=2)
    objective = Objective(algos.POLICY_LOSSES["ppo"], {"clip_low": 0.2, "clip_high": 0.28}, agg_mode=agg_mode,
                          entropy_coef=0.01, kl_coef=0.1, kl_estimator=algos.KL_ESTIMATORS["k3"], norm_len=17)
    args = dict(temperature=0.9, chunk_size=7, hidden_path=hidden_path, needs_old_log_probs=True)
    padded_loss, padded_grads = _loss_and_grads(model, PolicyScorer(**args), objective, b,
                                                list(torch.arange(len(b)).tensor_split(2)))
    budget = 30
    groups = token_micro_batches(row_lengths(b.attention_mask).tolist(), budget, packed=True)
    assert len(groups) >= 3  # the budget really splits the batch differently from the padded run
    packed_loss, packed_grads = _loss_and_grads(model, PolicyScorer(**args, packed=True, micro_batch_tokens=budget),
                                                objective, b, [torch.tensor(g) for g in groups])
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-6)
    assert packed_grads.keys() == padded_grads.keys()
    scale = max(float(g.abs().max()) for g in padded_grads.values())
    for k in padded_grads:
        torch.testing.assert_close(packed_grads[k], padded_grads[k], rtol=1e-4, atol=1e-5 * scale,
                                   msg=lambda msg: f"{k}: {msg}")


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_aggregation_is_invariant_to_the_token_budget(agg_mode):
    """One padded forward of the whole batch against packed micro-batches at budgets from 'every sample alone'
    (1 token: each sample is over it) to 'everything in one micro-batch' (400): same loss, same gradients."""
    model = tiny("llama", seed=6)
    b = ragged_batch(seed=7)
    objective = Objective(algos.POLICY_LOSSES["ppo"], {"clip_low": 0.2, "clip_high": 0.2}, agg_mode=agg_mode,
                          entropy_coef=0.0, kl_coef=0.05, kl_estimator=algos.KL_ESTIMATORS["k1"], norm_len=20)
    args = dict(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=True)
    lengths = row_lengths(b.attention_mask).tolist()
    whole_loss, whole_grads = _loss_and_grads(model, PolicyScorer(**args), objective, b, [torch.arange(len(b))])
    counts = []
    for budget in (1, 40, 400):
        groups = token_micro_batches(lengths, budget, packed=True)
        counts.append(len(groups))
        loss, grads = _loss_and_grads(model, PolicyScorer(**args, packed=True, micro_batch_tokens=budget), objective,
                                      b, [torch.tensor(g) for g in groups])
        assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6), budget
        scale = max(float(g.abs().max()) for g in whole_grads.values())
        for k in whole_grads:
            torch.testing.assert_close(grads[k], whole_grads[k], rtol=1e-4, atol=1e-5 * scale,
                                       msg=lambda msg: f"budget {budget}, {k}: {msg}")
    assert counts[0] == len(b) and counts[-1] == 1  # the extremes really are 'each alone' and 'all together'


def test_recompute_with_a_token_budget_equals_the_whole_batch_forward():
    model = tiny("llama", seed=3).eval()
    ref = tiny("llama", seed=4).eval()
    b = ragged_batch(seed=5)
    whole = Batch(samples=b.samples, problems=b.problems, group_ids=b.group_ids)
    for name in ("input_ids", "attention_mask", "loss_mask"):
        setattr(whole, name, getattr(b, name))
    args = dict(temperature=1.0, chunk_size=16, hidden_path=True, needs_old_log_probs=True, ref_model=ref)
    PolicyScorer(**args).recompute(model, whole)
    for packed in (True, False):
        split = Batch(samples=b.samples, problems=b.problems, group_ids=b.group_ids)
        for name in ("input_ids", "attention_mask", "loss_mask"):
            setattr(split, name, getattr(b, name))
        PolicyScorer(**args, packed=packed, micro_batch_tokens=25).recompute(model, split)
        torch.testing.assert_close(split.old_log_probs, whole.old_log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(split.ref_log_probs, whole.ref_log_probs, rtol=1e-5, atol=1e-5)


def test_rows_and_micro_batches_hold_every_sample_once_within_budget():
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(3.0 + 0.8 * torch.randn(200, generator=g)).clamp(1, 250).long().tolist()
    for width in (max(lengths), 300):
        rows = first_fit_rows(lengths, width)
        assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
        used = [sum(lengths[i] for i in r) for r in rows]
        assert all(u <= width for u in used)
        # first fit: the sample that opened a row fitted in no earlier row (which only filled up since)
        for k, r in enumerate(rows):
            assert all(lengths[r[0]] > width - used[j] for j in range(k))
        assert sum(used) / (len(rows) * width) > 0.9  # long-tailed lengths pack densely
    for packed in (True, False):
        groups = token_micro_batches(lengths, 600, packed=packed)
        assert sorted(i for grp in groups for i in grp) == list(range(len(lengths)))
        for grp in groups:
            cost = sum(lengths[i] for i in grp) if packed else len(grp) * max(lengths[i] for i in grp)
            assert cost <= 600 or len(grp) == 1
    assert len(token_micro_batches(lengths, 600, packed=True)) < len(token_micro_batches(lengths, 600, packed=False))
    more = split_to(token_micro_batches(lengths, 600, packed=True), 40)
    assert len(more) == 40 and sorted(i for grp in more for i in grp) == list(range(len(lengths)))


def test_left_padding_is_refused_with_the_row_named():
    attn = torch.tensor([[1, 1, 0], [0, 1, 1]])
    with pytest.raises(ValueError, match="attention_mask row 1 is not right-padded"):
        row_lengths(attn)
