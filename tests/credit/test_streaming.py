"""Streaming attention credit from q/k states agrees with the dense maps."""

from __future__ import annotations

import math

import pytest
import torch

from credo.credit.attention import fai, head_span, waad
from credo.credit.flow import flow_throughput
from credo.credit.streaming import attention_from_qk, streaming_flow_throughput, streaming_head_stats
from tests.credit._helpers import random_qk


def test_attention_from_qk_is_causal_softmax_with_gqa():
    # Explicit per-head loops: head h uses key head h // (H / H_kv), scale 1/sqrt(d).
    q, k = random_qk(heads=4, kv_heads=2, n=6, d=3, seed=0)
    maps = attention_from_qk(q, k)
    for h in range(4):
        for t in range(6):
            logits = [float(q[h, t] @ k[h // 2, s]) / math.sqrt(3) for s in range(t + 1)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            expected = [w / sum(weights) for w in weights] + [0.0] * (5 - t)
            torch.testing.assert_close(maps[h, t], torch.tensor(expected, dtype=torch.float64))


def dense_head_stats(q, k, response, window, h_lo, h_hi, scale=None):
    maps = attention_from_qk(q, k, scale=scale)
    flat = maps.reshape(-1, *maps.shape[-2:])
    span, _, _ = head_span(maps, response)
    waad_h = torch.stack([waad(a, window) for a in flat]).reshape(*maps.shape[:-1])
    fai_h = torch.stack([fai(a, response, h_lo, h_hi) for a in flat]).reshape(*maps.shape[:-1])
    return span, waad_h, fai_h


@pytest.mark.parametrize(
    "heads,kv_heads,n,block_size,heads_per_step",
    [(4, 4, 37, 1, 1), (6, 2, 37, 8, 1), (6, 3, 50, 16, 4), (2, 1, 23, 64, 2), (8, 2, 45, 7, 8)],
)
def test_head_stats_match_dense(heads, kv_heads, n, block_size, heads_per_step):
    q, k = random_qk(heads=heads, kv_heads=kv_heads, n=n, d=8, seed=n + heads)
    response = torch.arange(n) >= n // 3
    dense = dense_head_stats(q, k, response, window=4, h_lo=3, h_hi=11)
    streamed = streaming_head_stats(
        q, k, response_mask=response, window=4, h_lo=3, h_hi=11,
        block_size=block_size, heads_per_step=heads_per_step,
    )
    for a, b in zip(streamed, dense):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_head_stats_float32_layers_and_scale():
    # [L, H, N, d] inputs, a custom scale, float32: agreement to 1e-5 relative.
    q, k = random_qk(3, heads=4, kv_heads=2, n=41, d=16, seed=7, dtype=torch.float32)
    dense = dense_head_stats(q, k, None, window=10, h_lo=10, h_hi=100, scale=0.3)
    streamed = streaming_head_stats(q, k, window=10, h_lo=10, h_hi=100, scale=0.3, block_size=9)
    assert streamed[0].shape == (3, 4) and streamed[1].shape == (3, 4, 41)
    for a, b in zip(streamed, dense):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("block_size", [1, 6, 16, 100])
def test_flow_matches_dense(normalize, block_size):
    n = 43
    q, k = random_qk(2, heads=4, kv_heads=2, n=n, d=8, seed=block_size)
    question = torch.zeros(n, dtype=torch.bool)
    question[3:9] = True
    answer = torch.zeros(n, dtype=torch.bool)
    answer[35:39] = True
    dense = flow_throughput(attention_from_qk(q, k), question, answer, edge_threshold=0.01, normalize=normalize)
    streamed = streaming_flow_throughput(
        q, k, question, answer, edge_threshold=0.01, normalize=normalize,
        block_size=block_size, heads_per_step=3,
    )
    torch.testing.assert_close(streamed, dense, rtol=0, atol=1e-10)
    assert dense[answer].sum().item() == pytest.approx(1.0)


def test_flow_matches_dense_float32():
    n = 40
    q, k = random_qk(heads=6, kv_heads=2, n=n, d=16, seed=11, dtype=torch.float32)
    question = torch.arange(n) < 8
    answer = (torch.arange(n) >= 30) & (torch.arange(n) < 34)
    dense = flow_throughput(attention_from_qk(q, k), question, answer)
    streamed = streaming_flow_throughput(q, k, question, answer, block_size=7)
    torch.testing.assert_close(streamed, dense, rtol=0, atol=1e-5)


def test_shape_errors():
    q, k = random_qk(heads=6, kv_heads=4, n=5, d=2, seed=0)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        streaming_head_stats(q, k)
    q, k = random_qk(heads=4, kv_heads=2, n=5, d=2, seed=0)
    with pytest.raises(ValueError, match=r"response_mask has shape \[4\], expected \[5\]"):
        streaming_head_stats(q, k, response_mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^answer_mask has shape \[3\], expected \[5\] \(one per token\)$"):
        streaming_flow_throughput(q, k, torch.ones(5, dtype=torch.bool), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^question_mask has shape \[4\], expected \[5\] \(one per token\)$"):
        streaming_flow_throughput(q, k, torch.ones(4, dtype=torch.bool), torch.ones(5, dtype=torch.bool))


def test_flow_takes_the_given_logit_scale():
    n = 30
    q, k = random_qk(heads=4, kv_heads=2, n=n, d=8, seed=5)
    question, answer = torch.arange(n) < 6, torch.arange(n) >= 26
    dense = flow_throughput(attention_from_qk(q, k, scale=2.0), question, answer, edge_threshold=0.01)
    streamed = streaming_flow_throughput(q, k, question, answer, edge_threshold=0.01, scale=2.0, block_size=7)
    torch.testing.assert_close(streamed, dense, rtol=0, atol=1e-10)
    default = flow_throughput(attention_from_qk(q, k), question, answer, edge_threshold=0.01)
    assert (dense - default).abs().max() > 1e-3, "the scale must matter for this input"
