"""The batched capture path equals the per-sequence streaming path it replaced, on ragged padded batches."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.credit import (  # noqa: E402
    batched_flow_throughput,
    batched_head_stats,
    capture_qk,
    flow_gamma,
    flow_gamma_from_qk,
    group_heads,
    pack_tokens,
    rhythm_gamma,
    rhythm_gamma_from_qk,
    streaming_flow_throughput,
    streaming_head_stats,
)
from tests.credit.test_capture import tiny_model  # noqa: E402

# Real-token layouts: right padding, left padding, and holes (padding between real tokens).
LAYOUTS = {
    "right": [[1] * 19 + [0] * 0, [1] * 11 + [0] * 8, [1] * 15 + [0] * 4, [1] * 6 + [0] * 13],
    "left": [[0] * 0 + [1] * 19, [0] * 8 + [1] * 11, [0] * 4 + [1] * 15, [0] * 13 + [1] * 6],
    "holes": [[1] * 19, [1, 0] * 8 + [1, 1, 1], [0, 1, 1] * 6 + [0], [0] * 19],
}
RHYTHM_KW = dict(window=3, h_lo=1, h_hi=6)


def batch(layout: str, seed: int = 0):
    """ids, attention mask, response mask (the last ~60% of each sequence's real tokens), answer (last 2)."""
    attn = torch.tensor(LAYOUTS[layout])
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, attn.shape, generator=g) * attn  # pad id 0
    resp = torch.zeros(attn.shape, dtype=torch.bool)
    ans = torch.zeros(attn.shape, dtype=torch.bool)
    for b in range(attn.shape[0]):
        cols = attn[b].nonzero().flatten().tolist()
        start = len(cols) - (3 * len(cols)) // 5
        resp[b, cols[start:]] = True
        ans[b, cols[-2:]] = True
    return ids, attn, resp, ans


def captured(model, ids, attn, layers):
    with capture_qk(model, layers) as cap:
        with torch.no_grad():
            model.model(input_ids=ids, attention_mask=attn)
    return cap


def per_sequence_rhythm(cap, attn, resp, strategy):
    """The old path: one sequence at a time through the per-sequence streaming functions."""
    out = torch.ones(attn.shape)
    for b in range(attn.shape[0]):
        tokens = attn[b].bool().nonzero().flatten()
        if tokens.numel() == 0:
            continue
        q, k = cap.sequence(b, tokens)
        r = resp[b, tokens]
        span, w, f = streaming_head_stats(q, k, response_mask=r, scale=cap.scale, **RHYTHM_KW)
        local, global_ = group_heads(span, 0.3)
        out[b, tokens] = rhythm_gamma(w[local].mean(0), f[global_].mean(0), strategy=strategy, response_mask=r).float()
    return out


def per_sequence_flow(cap, attn, resp, ans):
    out = torch.ones(attn.shape)
    for b in range(attn.shape[0]):
        tokens = attn[b].bool().nonzero().flatten()
        if tokens.numel() == 0:
            continue
        q, k = cap.sequence(b, tokens)
        f = streaming_flow_throughput(q, k, ~resp[b, tokens], ans[b, tokens], scale=cap.scale, block_size=4)
        out[b, tokens] = flow_gamma(f, response_mask=resp[b, tokens]).float()
    return out


@pytest.mark.parametrize("layout", ["right", "left", "holes"])
@pytest.mark.parametrize("strategy", ["local", "global", "coupled"])
def test_batched_rhythm_equals_per_sequence(layout, strategy):
    model = tiny_model("qwen2", attn="sdpa")
    ids, attn, resp, _ = batch(layout)
    cap = captured(model, ids, attn, [1, 3])
    want = per_sequence_rhythm(cap, attn, resp, strategy)
    # a small scores_per_step splits the pairs of a block over several steps: same result
    for kw in ({}, {"block_size": 4, "scores_per_step": 50}):
        got = rhythm_gamma_from_qk(cap, attn, resp, strategy=strategy, **RHYTHM_KW, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (want[attn.sum(1) > 2] > 1).any(), "the comparison must not be all ones"
    assert (got[attn == 0] == 1).all()


@pytest.mark.parametrize("layout", ["right", "left", "holes"])
def test_batched_flow_equals_per_sequence(layout):
    model = tiny_model("llama", attn="sdpa")
    ids, attn, resp, ans = batch(layout, seed=1)
    cap = captured(model, ids, attn, [0, 2])
    want = per_sequence_flow(cap, attn, resp, ans)
    for kw in ({"block_size": 4}, {"block_size": 7, "scores_per_step": 30}):
        got = flow_gamma_from_qk(cap, attn, resp, ans, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (want > 1).any()


def test_head_stats_and_throughput_per_row_match_streaming():
    # Random states (not a model), float64, GQA 6 query heads over 2 key heads, padding slots poisoned
    # with NaN: the batch function scrubs nothing itself, so the valid mask alone must keep them out.
    g = torch.Generator().manual_seed(3)
    lengths = [9, 4, 0, 7]
    n = max(lengths)
    q = torch.randn(4, 6, n, 8, generator=g, dtype=torch.float64)
    k = torch.randn(4, 2, n, 8, generator=g, dtype=torch.float64)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    q.transpose(1, 2)[~valid] = float("nan")  # [B, n, H, d] view: the mask picks padding slots
    k.transpose(1, 2)[~valid] = float("nan")
    resp = valid & (torch.arange(n)[None, :] >= 2)
    ans = valid & (torch.arange(n)[None, :] == torch.tensor(lengths)[:, None] - 1)
    span, w, f = batched_head_stats(q, k, valid, resp, window=2, h_lo=1, h_hi=3, block_size=3, scores_per_step=20)
    thr = batched_flow_throughput(q, k, valid, valid & ~resp, ans, block_size=3, scores_per_step=20)
    for b, m in enumerate(lengths):
        if m == 0:
            assert (span[b] == 0).all() and (w[b] == 0).all() and (thr[b] == 0).all()
            continue
        s_ref, w_ref, f_ref = streaming_head_stats(q[b, :, :m], k[b, :, :m], response_mask=resp[b, :m], window=2,
                                                   h_lo=1, h_hi=3, block_size=m)
        torch.testing.assert_close(span[b], s_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(w[b, :, :m], w_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(f[b, :, :m], f_ref, rtol=0, atol=1e-12)
        t_ref = streaming_flow_throughput(q[b, :, :m], k[b, :, :m], ~resp[b, :m], ans[b, :m], block_size=m)
        torch.testing.assert_close(thr[b, :m], t_ref, rtol=0, atol=1e-12)
        assert (thr[b, m:] == 0).all() and (w[b, :, m:] == 0).all()


def test_pack_tokens_against_a_loop():
    attn = torch.tensor(LAYOUTS["holes"])
    index, valid = pack_tokens(attn)
    assert index.shape == valid.shape == (4, 19)
    for b in range(4):
        cols = attn[b].nonzero().flatten().tolist()
        assert index[b, : len(cols)].tolist() == cols
        assert valid[b].tolist() == [True] * len(cols) + [False] * (19 - len(cols))
        assert sorted(index[b].tolist()) == list(range(19))  # a permutation: scatter back is exact


def test_bad_shapes_name_the_tensor():
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 5, 8)
    valid = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"response_mask has shape \[2, 4\], expected \[2, 5\]"):
        batched_head_stats(q, k, valid, valid[:, :4])
    with pytest.raises(ValueError, match="answer_mask has shape"):
        batched_flow_throughput(q, k, valid, valid, valid[:1])
    with pytest.raises(ValueError, match="scores_per_step=0"):
        batched_head_stats(q, k, valid, valid, scores_per_step=0)
    with pytest.raises(ValueError, match=r"^attention_mask has shape \[5\], expected \[B, N\]$"):
        pack_tokens(valid[0])


def test_pairs_per_step_fills_the_score_budget():
    from credo.credit.batched import _pairs_per_step

    # a (batch, head) pair scores min(block_size, n) query rows against n keys at a time
    assert _pairs_per_step(1000, 4, 10) == 1000 // (4 * 10)
    assert _pairs_per_step(1000, 64, 10) == 1000 // (10 * 10)  # a block longer than the sequence is the sequence
    assert _pairs_per_step(5, 4, 10) == 1  # under one pair's scores: still one pair a step
    with pytest.raises(ValueError, match=r"^scores_per_step=0, expected a positive int$"):
        _pairs_per_step(0, 4, 10)


def test_a_query_of_the_wrong_rank_and_a_key_of_the_wrong_width_are_named():
    valid = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^q has shape \[4, 5, 8\], expected \[B, P, n, d\]$"):
        batched_flow_throughput(torch.zeros(4, 5, 8), torch.zeros(2, 2, 5, 8), valid, valid, valid)
    # head width 8 vs 5 tokens: the message gives the expected [.., n, d] of q, not d twice
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 5, 7)
    with pytest.raises(ValueError, match=r"^k has shape \[2, 2, 5, 7\], expected \[\.\.\., H_kv, 5, 8\] "
                                         r"with leading dims \[2\] like q$"):
        streaming_head_stats(q, k)
