"""The packed-batch credit functions at their edges: errors, defaults, dtypes, masks on padding, exact thresholds.

References: the per-sequence streaming functions (each row on its real tokens), hand-worked values, loops.
"""

from __future__ import annotations

import pytest
import torch

from credo.credit.attention import group_heads
from credo.credit.batched import batched_flow_throughput, batched_head_stats, group_heads_rows, pack_tokens
from credo.credit.streaming import streaming_flow_throughput, streaming_head_stats


def ragged(lengths, heads, kv_heads, d, seed, dtype=torch.float64, scale=1.0):
    """Packed q [B, H, n, d], k [B, H_kv, n, d] with NaN on padding slots, and valid [B, n]."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    q = torch.randn(len(lengths), heads, n, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(len(lengths), kv_heads, n, d, generator=g, dtype=torch.float64)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    q.transpose(1, 2)[~valid] = float("nan")
    k.transpose(1, 2)[~valid] = float("nan")
    return q.to(dtype), k.to(dtype), valid


# ---------------------------------------------------------------- pack_tokens


def test_pack_tokens_of_an_empty_batch_and_of_all_padding():
    index, valid = pack_tokens(torch.zeros(0, 5))
    assert index.shape == valid.shape == (0, 0)
    index, valid = pack_tokens(torch.zeros(2, 3))  # no real token anywhere: width 0
    assert index.shape == valid.shape == (2, 0)
    index, valid = pack_tokens(torch.zeros(2, 0))
    assert index.shape == valid.shape == (2, 0)


def test_pack_tokens_reads_any_nonzero_as_real():
    mask = torch.tensor([[0.0, 0.5, 0.0, 2.0], [-1.0, 0.0, 0.0, 0.0]])
    index, valid = pack_tokens(mask)
    assert index.dtype == torch.int64 and valid.dtype == torch.bool
    assert index.shape == (2, 2)  # the longest row has 2 real tokens
    assert index[0].tolist() == [1, 3] and index[1, 0].item() == 0
    assert valid.tolist() == [[True, True], [True, False]]


def test_pack_tokens_of_a_full_row_keeps_its_order():
    index, valid = pack_tokens(torch.ones(1, 4, dtype=torch.long))
    assert index.tolist() == [[0, 1, 2, 3]] and valid.all()


# ---------------------------------------------------------------- batched_head_stats


def test_head_stats_argument_errors():
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 5, 8)
    valid = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^q has shape \[4, 5, 8\], expected \[B, H, n, d\]$"):
        batched_head_stats(torch.zeros(4, 5, 8), torch.zeros(2, 5, 8), valid[0], valid[0])
    with pytest.raises(ValueError, match=r"^valid has shape \[2, 4\], expected \[2, 5\] like q's \[B, n\]$"):
        batched_head_stats(q, k, valid[:, :4], valid)
    with pytest.raises(ValueError, match=r"^response_mask has shape \[1, 5\], expected \[2, 5\] like q's \[B, n\]$"):
        batched_head_stats(q, k, valid, valid[:1])
    with pytest.raises(ValueError, match=r"^window=-1, expected a non-negative int$"):
        batched_head_stats(q, k, valid, valid, window=-1)
    with pytest.raises(ValueError, match=r"^h_lo=-1, h_hi=2, expected 0 <= h_lo <= h_hi$"):
        batched_head_stats(q, k, valid, valid, h_lo=-1, h_hi=2)
    with pytest.raises(ValueError, match=r"^h_lo=3, h_hi=2, expected 0 <= h_lo <= h_hi$"):
        batched_head_stats(q, k, valid, valid, h_lo=3, h_hi=2)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        batched_head_stats(q, torch.zeros(2, 3, 5, 8), valid, valid)
    with pytest.raises(ValueError, match=r"^block_size=0, heads_per_step=\d+, expected positive ints$"):
        batched_head_stats(q, k, valid, valid, block_size=0)


def per_row_stats(q, k, valid, resp, **kw):
    out = []
    for b in range(q.shape[0]):
        m = int(valid[b].sum())
        out.append(streaming_head_stats(q[b, :, :m], k[b, :, :m], response_mask=resp[b, :m], block_size=max(m, 1),
                                        **kw) if m else None)
    return out


def check_stats_against_rows(got, ref, valid, atol):
    span, w, f = got
    for b, r in enumerate(ref):
        m = int(valid[b].sum())
        if r is None:
            assert (span[b] == 0).all() and (w[b] == 0).all() and (f[b] == 0).all()
            continue
        torch.testing.assert_close(span[b], r[0].to(span.dtype), rtol=0, atol=atol)
        torch.testing.assert_close(w[b, :, :m], r[1].to(w.dtype), rtol=0, atol=atol)
        torch.testing.assert_close(f[b, :, :m], r[2].to(f.dtype), rtol=0, atol=atol)
        assert (w[b, :, m:] == 0).all() and (f[b, :, m:] == 0).all()


def test_head_stats_defaults_and_a_response_mask_that_covers_padding():
    # Defaults window 10, horizon [10, 100]: the longest row has 103 tokens so both horizon ends matter.
    # The response mask is True on padding slots too: only the real slots may count.
    lengths = [103, 60, 12]
    q, k, valid = ragged(lengths, heads=2, kv_heads=1, d=2, seed=1, scale=3.0)
    resp = torch.ones(3, 103, dtype=torch.bool)
    resp[:, :3] = False
    got = batched_head_stats(q, k, valid, resp, block_size=40)
    ref = per_row_stats(q, k, valid, resp, window=10, h_lo=10, h_hi=100)
    check_stats_against_rows(got, ref, valid, atol=1e-12)
    assert got[0].dtype == torch.float64 and got[0].shape == (3, 2) and got[1].shape == got[2].shape == (3, 2, 103)


@pytest.mark.parametrize("block_size,scores_per_step", [(1, 1), (2, 7), (3, 40), (16, 10**6)])
def test_head_stats_with_one_response_token_zero_window_and_one_horizon(block_size, scores_per_step):
    lengths = [6, 1, 0, 5]
    q, k, valid = ragged(lengths, heads=3, kv_heads=3, d=4, seed=2)
    resp = torch.zeros(4, 6, dtype=torch.bool)
    resp[0, 5] = resp[1, 0] = resp[3, [1, 4]] = True  # the last token / the only token / two tokens
    for kw in (dict(window=0, h_lo=2, h_hi=2), dict(window=2, h_lo=0, h_hi=1), dict(window=1, h_lo=1, h_hi=4)):
        got = batched_head_stats(q, k, valid, resp, block_size=block_size, scores_per_step=scores_per_step, **kw)
        check_stats_against_rows(got, per_row_stats(q, k, valid, resp, **kw), valid, atol=1e-12)
    got = batched_head_stats(q, k, valid, resp, window=0, h_lo=0, h_hi=0)
    assert (got[1] == 0).all()


def test_head_stats_of_float32_states_and_a_given_scale():
    lengths = [7, 4]
    q, k, valid = ragged(lengths, heads=4, kv_heads=2, d=8, seed=3, dtype=torch.float32)
    resp = valid.clone()
    resp[:, 0] = False
    kw = dict(window=3, h_lo=1, h_hi=3, scale=0.7)
    got = batched_head_stats(q, k, valid, resp, block_size=3, **kw)
    assert all(x.dtype == torch.float32 for x in got)
    check_stats_against_rows(got, per_row_stats(q.double(), k.double(), valid, resp, **kw), valid, atol=1e-5)
    default = batched_head_stats(q, k, valid, resp, window=3, h_lo=1, h_hi=3)
    check_stats_against_rows(default, per_row_stats(q.double(), k.double(), valid, resp, window=3, h_lo=1, h_hi=3),
                             valid, atol=1e-5)
    assert (default[1] - got[1]).abs().max() > 1e-3, "the scale must matter for this input"


def test_head_stats_without_padding_take_the_states_as_they_are():
    q, k, valid = ragged([5, 5], heads=2, kv_heads=1, d=3, seed=4)
    resp = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 0, 1, 1]])  # an int mask
    kw = dict(window=2, h_lo=1, h_hi=2)
    got = batched_head_stats(q, k, valid.long(), resp, **kw)
    check_stats_against_rows(got, per_row_stats(q, k, valid, resp.bool(), **kw), valid, atol=1e-12)


# ---------------------------------------------------------------- group_heads_rows


@pytest.mark.parametrize("quantile", [0.0, -0.1, 1.5])
def test_group_heads_rows_needs_a_quantile_in_0_1(quantile):
    with pytest.raises(ValueError, match=rf"^quantile={quantile}, expected a value in \(0, 1\]$"):
        group_heads_rows(torch.zeros(2, 4), quantile)


def test_group_heads_rows_by_hand():
    span = torch.tensor([[3.0, 1.0, 2.0, 5.0, 4.0, 0.5, 6.0, 7.0, 2.5, 8.0],
                         [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], requires_grad=True)
    local, global_ = group_heads_rows(span)  # default 0.3 of 10 -> 3 heads each
    assert local[0].nonzero().flatten().tolist() == [1, 2, 5]
    assert global_[0].nonzero().flatten().tolist() == [6, 7, 9]
    # all tied: the first three columns both ways (ties by column)
    assert local[1].nonzero().flatten().tolist() == [0, 1, 2] == global_[1].nonzero().flatten().tolist()
    local, global_ = group_heads_rows(span, 1.0)
    assert local.all() and global_.all()
    for b in range(2):  # the same as group_heads on each row
        for quantile in (0.3, 0.5, 0.05):
            want = group_heads(span[b], quantile)
            got = group_heads_rows(span, quantile)
            assert got[0][b].tolist() == want[0].tolist() and got[1][b].tolist() == want[1].tolist()


# ---------------------------------------------------------------- batched_flow_throughput


def test_flow_argument_errors():
    q, k = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 5, 8)
    valid = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^valid has shape \[5\], expected \[2, 5\] like q's \[B, n\]$"):
        batched_flow_throughput(q, k, valid[0], valid, valid)
    with pytest.raises(ValueError, match=r"^question_mask has shape \[2, 6\], expected \[2, 5\] like q's \[B, n\]$"):
        batched_flow_throughput(q, k, valid, torch.ones(2, 6), valid)
    with pytest.raises(ValueError, match=r"^answer_mask has shape \[1, 5\], expected \[2, 5\] like q's \[B, n\]$"):
        batched_flow_throughput(q, k, valid, valid, valid[:1])
    with pytest.raises(ValueError, match=r"^k has shape \[2, 2, 5, 7\], expected"):
        batched_flow_throughput(q, torch.zeros(2, 2, 5, 7), valid, valid, valid)
    with pytest.raises(ValueError, match=r"^scores_per_step=-3, expected a positive int$"):
        batched_flow_throughput(q, k, valid, valid, valid, scores_per_step=-3)


def per_row_flow(q, k, valid, question, answer, **kw):
    out = torch.zeros(valid.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        m = int(valid[b].sum())
        if m:
            out[b, :m] = streaming_flow_throughput(q[b, :, :m], k[b, :, :m], question[b, :m], answer[b, :m],
                                                   block_size=max(m, 1), **kw)
    return out


def flow_batch(seed, dtype=torch.float64):
    lengths = [11, 7, 0, 9, 1]
    q, k, valid = ragged(lengths, heads=4, kv_heads=2, d=4, seed=seed, dtype=dtype)
    pos = torch.arange(11)[None, :]
    ends = torch.tensor(lengths)[:, None]
    question = (pos < 3).expand(5, 11)  # True on padding slots of short rows (row 4's only token is a question)
    answer = (pos >= ends - 2) | (pos >= 9).expand(5, 11)  # the last two real tokens, and padding slots 9, 10
    return q, k, valid, question, answer


@pytest.mark.parametrize("normalize,edge_threshold", [(True, 0.0), (False, 0.0), (True, 0.05), (False, 0.05)])
@pytest.mark.parametrize("block_size,scores_per_step", [(1, 1), (4, 30), (3, 10**6)])
def test_flow_equals_per_row_streaming(normalize, edge_threshold, block_size, scores_per_step):
    q, k, valid, question, answer = flow_batch(seed=5)
    got = batched_flow_throughput(q, k, valid, question, answer, normalize=normalize, edge_threshold=edge_threshold,
                                  block_size=block_size, scores_per_step=scores_per_step)
    want = per_row_flow(q, k, valid, question, answer, normalize=normalize, edge_threshold=edge_threshold)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert got.dtype == torch.float64 and got.shape == (5, 11)
    assert (got[~valid] == 0).all()
    assert got[0].sum() > 0 and got[3].sum() > 0


def test_flow_defaults_float32_and_scale():
    q, k, valid, question, answer = flow_batch(seed=6, dtype=torch.float32)
    got = batched_flow_throughput(q, k, valid, question.long(), answer.long())
    want = per_row_flow(q, k, valid, question, answer, edge_threshold=0.0, normalize=True)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (got - per_row_flow(q, k, valid, question, answer, normalize=False)).abs().max() > 1e-3
    scaled = batched_flow_throughput(q, k, valid, question, answer, scale=3.0, block_size=4)
    torch.testing.assert_close(scaled, per_row_flow(q, k, valid, question, answer, scale=3.0), rtol=0, atol=1e-6)
    assert (scaled - got).abs().max() > 1e-3, "the scale must matter for this input"


@pytest.mark.parametrize("block_size,scores_per_step", [(1, 1), (2, 12), (5, 10**6)])
def test_flow_of_uniform_maps_with_an_edge_exactly_at_the_threshold(block_size, scores_per_step):
    # Zero states: row t attends 1/(t+1) to each s <= t (exact), so C[k, i] = 1/(k+1). Threshold 1/4,
    # unnormalised, answer {3}, question {0}: h = [1/2, 1/3, 1/4, 1, 0] and f = [1, 1/3, 1/4, 1, 0]
    # (worked in tests/credit/test_streaming_boundaries.py). Row 1 is the same sequence padded by one slot;
    # row 2 has only its first 3 tokens, none an answer: all zeros.
    q = torch.zeros(3, 2, 6, 4, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]).bool()
    q.transpose(1, 2)[~valid] = float("nan")
    question = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0]]).bool()
    answer = torch.tensor([[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 1], [0, 0, 0, 1, 0, 0]]).bool()
    f = batched_flow_throughput(q, q[:, :1], valid, question, answer, edge_threshold=0.25, normalize=False,
                                block_size=block_size, scores_per_step=scores_per_step)
    want = torch.tensor([1.0, 1 / 3, 1 / 4, 1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(f[0], want, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(f[1], want, rtol=1e-14, atol=1e-15)
    assert f[2].tolist() == [0.0] * 6


def test_pairs_per_step_of_one_token_sequences_fill_the_budget():
    from credo.credit.batched import _pairs_per_step

    # a pair of a one-token batch scores 1 x 1: the budget of 1000 scores takes 1000 pairs a step
    assert _pairs_per_step(1000, 4, 1) == 1000
    assert _pairs_per_step(1000, 4, 0) == 1000  # an empty batch: no division by zero
    assert _pairs_per_step(1, 4, 1) == 1
