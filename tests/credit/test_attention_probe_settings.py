"""The attention_credit probe's settings and its baselines by hand: defaults, every error message, the keys each
strategy accepts, the random baseline's draws against a naive re-draw (seed, step, rank, micro-batch views), the
metrics of a batch without loss tokens, and the helpers. No model: milliseconds."""

from __future__ import annotations

import contextlib
import re
from types import SimpleNamespace

import pytest
import torch

from credo.config import ConfigError
from credo.families.attention.probe import (STRATEGIES, AttentionCreditProbe, _last_tokens, _mix,
                                         make_attention_credit_probe)
from credo.train.batch import Batch
from credo.train.scoring import _rows_view

KEY = "stages.probe_kwargs.attention_credit"
LOCAL = ["alpha", "block_size", "h_hi", "h_lo", "head_quantile", "h_lo", "k", "scores_per_step", "tau_delta",
         "tau_waad", "window"]


def make_batch(step=3, B=3, T=10):
    g = torch.Generator().manual_seed(2)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 2:] = True  # 8 loss tokens
    mask[1, 4:9] = True  # 5
    mask[2, 1:7] = True  # 6
    b = Batch(samples=[None] * B, problems=[None] * B, group_ids=torch.arange(B), step=step)
    b.loss_mask = b.response_mask = mask
    b.attention_mask = torch.ones(B, T + 1, dtype=torch.long)
    b.input_ids = torch.randint(0, 9, (B, T + 1), generator=g)
    b.advantages = torch.where(mask, torch.tensor([1.0, -1.0, 2.0])[:, None], torch.zeros(()))
    return b


def naive_random(seed, step, rank, mask, q, amp):
    """Re-draw by hand: uniform scores from the mixed seed, the nearest-integer q share of each row's loss tokens
    with the highest scores amplified."""
    M = 2**63 - 1
    value = ((seed * 1_000_003 + step) % M * 1_000_003 + rank) % M
    scores = torch.rand(mask.shape, generator=torch.Generator().manual_seed(value))
    out = torch.ones(mask.shape)
    for b in range(mask.shape[0]):
        cols = [j for j in range(mask.shape[1]) if mask[b, j]]
        top = sorted(cols, key=lambda j: -scores[b, j].item())[: int(q * len(cols) + 0.5)]
        out[b, top] = amp
    return out


def test_defaults():
    p = AttentionCreditProbe()
    assert (p.strategy, p.layers, p.q, p.gamma_amp, p.sign_mode, p.answer_tokens, p.seed, p.storage_device,
            p.rank, p.credit_kwargs) == ("coupled", None, 0.4, 1.5, "both", 8, 0, None, 0, {})
    assert p.name == "attention_credit" and p.rides_update is True and p.needs_entropy is False
    assert AttentionCreditProbe("entropy").needs_entropy is True
    assert STRATEGIES == ("local", "global", "coupled", "flow", "random", "entropy")


def test_error_messages_name_the_key_and_the_choices():
    with pytest.raises(ConfigError, match="^" + re.escape(
            f"config key '{KEY}.strategy' = 'anchors', expected one of {STRATEGIES}") + "$"):
        AttentionCreditProbe("anchors")
    with pytest.raises(ConfigError, match="^" + re.escape(
            f"config key '{KEY}.answer_tokens' = 0, expected a positive int") + "$"):
        AttentionCreditProbe("flow", answer_tokens=0)
    assert AttentionCreditProbe("flow", answer_tokens=1).answer_tokens == 1
    common = "(accepted besides strategy, layers, q, gamma_amp, sign_mode, answer_tokens, seed, storage_device: "
    with pytest.raises(ConfigError, match="^" + re.escape(
            f"config key '{KEY}' has unknown key(s) ['a', 'window'] for strategy 'flow' {common}"
            "['block_size', 'edge_threshold', 'normalize', 'scores_per_step'])") + "$"):
        AttentionCreditProbe("flow", window=2, a=1)
    with pytest.raises(ConfigError, match="^" + re.escape(
            f"config key '{KEY}' has unknown key(s) ['block_size'] for strategy 'random' {common}[])") + "$"):
        AttentionCreditProbe("random", block_size=4)
    local = sorted(set(LOCAL))
    for strategy in ("local", "global", "coupled"):
        with pytest.raises(ConfigError, match=re.escape(f"for strategy '{strategy}' {common}{local})") + "$"):
            AttentionCreditProbe(strategy, normalize=True)


def test_flow_accepts_its_own_keys():
    kw = dict(edge_threshold=0.1, normalize=False, block_size=4, scores_per_step=2)
    assert AttentionCreditProbe("flow", **kw).credit_kwargs == kw


def test_baselines_capture_nothing_attention_strategies_hook_the_model():
    for strategy in ("random", "entropy"):
        assert isinstance(AttentionCreditProbe(strategy).capture(None), contextlib.nullcontext)
    for strategy in ("local", "flow"):
        assert not isinstance(AttentionCreditProbe(strategy).capture(None), contextlib.nullcontext)


def test_result_without_a_captured_forward_is_an_error():
    with pytest.raises(RuntimeError, match=r"^attention_credit: result\(\) called without a captured forward "
                                           r"\(capture\(\) not entered\)$"):
        AttentionCreditProbe("coupled").result(make_batch(), torch.zeros(3, 10), None)


def test_the_entropy_baseline_without_entropy_is_an_error():
    with pytest.raises(RuntimeError, match=r"^attention_credit: strategy 'entropy' needs the recompute's entropy, "
                                           r"got None$"):
        AttentionCreditProbe("entropy").result(make_batch(), torch.zeros(3, 10), None)


@pytest.mark.parametrize("seed, step, rank", [(3, 5, 0), (3, 5, 2), (0, 1, 1)])
def test_random_draws_follow_seed_step_and_rank(seed, step, rank):
    batch = make_batch(step=step)
    probe = AttentionCreditProbe("random", seed=seed, rank=rank, q=0.5, gamma_amp=2.5)
    out = probe.result(batch, torch.zeros(3, 10, dtype=torch.float64), None)["weights"]
    want = naive_random(seed, step, rank, batch.loss_mask, 0.5, 2.5)
    assert out.dtype == torch.float32 and torch.equal(out, want)
    # rows 0..2 hold 8, 5, 6 loss tokens: 4 + 3 + 3 amplified of 19 (round half up)
    assert batch.metrics["credit/gamma_mean"] == pytest.approx((19 + 10 * 1.5) / 19)
    assert batch.metrics["credit/gamma_max"] == 2.5
    assert batch.metrics["credit/amplified_frac"] == pytest.approx(10 / 19)


def test_a_micro_batch_view_draws_its_rows_of_the_whole_batch():
    batch = make_batch(step=4)
    whole = AttentionCreditProbe("random", seed=1).result(batch, torch.zeros(3, 10), None)["weights"]
    rows = torch.tensor([2, 0])
    view = _rows_view(make_batch(step=4), rows)
    part = AttentionCreditProbe("random", seed=1).result(view, torch.zeros(2, 10), None)["weights"]
    assert torch.equal(part, whole[[2, 0]])
    assert torch.equal(whole, naive_random(1, 4, 0, batch.loss_mask, 0.4, 1.5))


def test_the_entropy_baseline_with_sign_mode_negative():
    batch = make_batch()
    entropy = torch.arange(30, dtype=torch.float32).reshape(3, 10)  # increasing: the last loss tokens win
    out = AttentionCreditProbe("entropy", q=0.2, gamma_amp=3.0, sign_mode="negative").result(
        batch, torch.zeros(3, 10), entropy)["weights"]
    want = torch.ones(3, 10)
    want[1, 8] = 3.0  # only row 1 has a negative advantage; round(0.2 * 5) = 1 token, its highest entropy
    assert torch.equal(out, want)


def test_no_loss_token_gives_neutral_metrics():
    batch = make_batch()
    batch.loss_mask = torch.zeros(3, 10, dtype=torch.bool)
    out = AttentionCreditProbe("random").result(batch, torch.zeros(3, 10), None)["weights"]
    assert (out == 1).all()
    assert (batch.metrics["credit/gamma_mean"], batch.metrics["credit/gamma_max"],
            batch.metrics["credit/amplified_frac"]) == (1.0, 1.0, 0.0)


def test_last_tokens_by_hand():
    response = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert _last_tokens(response, 2).int().tolist() == [[0, 0, 0, 1, 1, 0], [1, 0, 1, 0, 0, 0], [0] * 6]
    assert _last_tokens(response, 1).int().tolist() == [[0, 0, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0], [0] * 6]


def test_mix_by_hand():
    assert _mix() == 0
    assert _mix(7) == 7
    assert _mix(3, 5) == 3 * 1_000_003 + 5
    assert _mix(2**62, 2**62) == (2**62 * 1_000_003 + 2**62) % (2**63 - 1)


def test_factory_passes_the_keywords_and_the_rank():
    ctx = SimpleNamespace(seed=7, rank=2)
    p = make_attention_credit_probe(ctx, strategy="random", q=0.3, gamma_amp=2.0, sign_mode="positive")
    assert (p.strategy, p.q, p.gamma_amp, p.sign_mode, p.seed, p.rank) == ("random", 0.3, 2.0, "positive", 7, 2)


def test_a_capture_serves_one_result_and_its_hook_time_is_counted():
    from tests.credit.test_attention_probe import make_batch as model_batch
    from tests.credit.test_attention_probe import tiny_qwen2

    probe = AttentionCreditProbe("coupled", layers=[1], window=2, h_lo=1, h_hi=4)
    batch = model_batch()
    model = tiny_qwen2()
    with torch.no_grad(), probe.capture(model):
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hook_s = probe._capture.hook_s
    assert hook_s > 0
    out = probe.result(batch, torch.zeros(batch.loss_mask.shape), None)
    assert out["weights"].shape == batch.loss_mask.shape
    assert batch.metrics["perf/credit_s"] >= hook_s
    with pytest.raises(RuntimeError, match=r"without a captured forward"):  # the states are not reused
        probe.result(batch, torch.zeros(batch.loss_mask.shape), None)
