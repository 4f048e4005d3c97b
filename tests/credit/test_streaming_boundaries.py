"""The streaming credit functions at their edges: argument errors, defaults, dtypes, GQA across layers.

References are explicit loops or the dense functions of :mod:`credo.credit.attention` / :mod:`credo.credit.flow`.
"""

from __future__ import annotations

import math

import pytest
import torch

from credo.credit.attention import fai, head_span, waad
from credo.credit.flow import flow_throughput
from credo.credit.streaming import attention_from_qk, streaming_flow_throughput, streaming_head_stats
from tests.credit._helpers import random_qk


def loop_maps(q, k, scale):
    """[L, H, N, N] causal softmax maps by explicit loops: layer l's head h reads key head h // (H / H_kv)."""
    layers, heads, n, _ = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(layers, heads, n, n, dtype=torch.float64)
    for l in range(layers):
        for h in range(heads):
            for t in range(n):
                logits = [float(q[l, h, t].double() @ k[l, h // group, s].double()) * scale for s in range(t + 1)]
                top = max(logits)
                w = [math.exp(x - top) for x in logits]
                out[l, h, t, : t + 1] = torch.tensor([x / sum(w) for x in w], dtype=torch.float64)
    return out


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_from_qk_maps_each_layer_to_its_own_key_heads(kv_heads):
    q, k = random_qk(3, heads=4, kv_heads=kv_heads, n=5, d=3, seed=kv_heads)
    maps = attention_from_qk(q, k)  # default scale 1/sqrt(3)
    assert maps.shape == (3, 4, 5, 5) and maps.dtype == torch.float64
    torch.testing.assert_close(maps, loop_maps(q, k, 1 / math.sqrt(3)), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_from_qk_of_low_precision_states_is_float32(dtype):
    q, k = random_qk(heads=2, kv_heads=1, n=4, d=2, seed=1, dtype=dtype)
    maps = attention_from_qk(q, k, scale=0.5)
    assert maps.dtype == torch.float32
    torch.testing.assert_close(maps, loop_maps(q[None], k[None], 0.5)[0].float(), rtol=1e-5, atol=1e-6)


def test_qk_shape_errors_name_both_tensors():
    with pytest.raises(ValueError, match=r"^q has shape \[5, 2\] and k \[5, 2\], expected \[\.\.\., H, N, d\] and "
                                         r"\[\.\.\., H_kv, N, d\] with the same number of dimensions$"):
        attention_from_qk(torch.zeros(5, 2), torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"^q has shape \[2, 5, 2\] and k \[1, 2, 5, 2\], expected"):
        streaming_head_stats(torch.zeros(2, 5, 2), torch.zeros(1, 2, 5, 2))
    with pytest.raises(ValueError, match=r"^k has shape \[3, 2, 5, 8\], expected \[\.\.\., H_kv, 5, 8\] "
                                         r"with leading dims \[2\] like q$"):
        attention_from_qk(torch.zeros(2, 4, 5, 8), torch.zeros(3, 2, 5, 8))
    with pytest.raises(ValueError, match=r"^k has shape \[2, 6, 8\], expected \[\.\.\., H_kv, 5, 8\] "
                                         r"with leading dims \[\] like q$"):
        attention_from_qk(torch.zeros(4, 5, 8), torch.zeros(2, 6, 8))
    with pytest.raises(ValueError, match=r"^q has 4 heads and k 0; expected H a multiple of H_kv$"):
        attention_from_qk(torch.zeros(4, 5, 8), torch.zeros(0, 5, 8))
    with pytest.raises(ValueError, match=r"^q has 4 heads and k 3; expected H a multiple of H_kv$"):
        streaming_flow_throughput(torch.zeros(4, 5, 8), torch.zeros(3, 5, 8), torch.ones(5), torch.ones(5))


@pytest.mark.parametrize("block_size,heads_per_step", [(0, 1), (4, 0), (-1, -2)])
def test_block_arguments_must_be_positive(block_size, heads_per_step):
    q, k = random_qk(heads=2, kv_heads=1, n=5, d=2, seed=0)
    msg = rf"^block_size={block_size}, heads_per_step={heads_per_step}, expected positive ints$"
    with pytest.raises(ValueError, match=msg):
        streaming_head_stats(q, k, block_size=block_size, heads_per_step=heads_per_step)
    with pytest.raises(ValueError, match=msg):
        streaming_flow_throughput(q, k, torch.ones(5), torch.ones(5), block_size=block_size,
                                  heads_per_step=heads_per_step)


def test_head_stats_argument_errors_and_their_boundaries():
    q, k = random_qk(heads=2, kv_heads=1, n=6, d=2, seed=0)
    with pytest.raises(ValueError, match=r"^window=-1, expected a non-negative int$"):
        streaming_head_stats(q, k, window=-1)
    with pytest.raises(ValueError, match=r"^h_lo=-1, h_hi=3, expected 0 <= h_lo <= h_hi$"):
        streaming_head_stats(q, k, h_lo=-1, h_hi=3)
    with pytest.raises(ValueError, match=r"^h_lo=4, h_hi=3, expected 0 <= h_lo <= h_hi$"):
        streaming_head_stats(q, k, h_lo=4, h_hi=3)
    # window 0, h_lo 0 and h_lo == h_hi are allowed: WAAD is then all zero, FAI reads one diagonal.
    span, w, f = streaming_head_stats(q, k, window=0, h_lo=0, h_hi=0)
    assert (w == 0).all()
    maps = attention_from_qk(q, k)
    # h = 0: T(s) = {s}, so FAI(s) = A[s, s].
    torch.testing.assert_close(f, maps.diagonal(dim1=-2, dim2=-1), rtol=0, atol=1e-12)
    span2, _, f2 = streaming_head_stats(q, k, h_lo=2, h_hi=2)
    # h = 2: T(s) = {s + 2} for s < 4, empty (FAI 0) for s = 4, 5.
    want = torch.zeros(2, 6, dtype=torch.float64)
    want[:, :4] = maps.diagonal(offset=-2, dim1=-2, dim2=-1)
    torch.testing.assert_close(f2, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(span2, span, rtol=0, atol=0)  # the span does not depend on the horizon


def loop_stats(maps, response, window, h_lo, h_hi):
    """Span, WAAD, FAI of one head's [N, N] map by explicit loops (arXiv 2510.13554, Eq. 7-10)."""
    n = maps.shape[-1]
    rows = [t for t in range(n) if response[t]]
    span = sum(float(maps[t, s]) * (t - s) for t in rows for s in range(t + 1)) / max(1, len(rows))
    w = [sum(float(maps[t, s]) * min(t - s, window) for s in range(t + 1)) for t in range(n)]
    f = []
    for s in range(n):
        ts = [t for t in rows if h_lo <= t - s <= h_hi]
        f.append(sum(float(maps[t, s]) for t in ts) / len(ts) if ts else 0.0)
    return span, w, f


def test_head_stats_defaults_are_window_10_and_horizon_10_to_100():
    # 103 tokens and response rows at distances 10 (40 - 30) and 100 / 101 (101 - 1, 102 - 1) of some token:
    # both ends of the horizon and the window of 10 matter.
    n = 103
    q, k = random_qk(heads=2, kv_heads=1, n=n, d=2, seed=4)
    q = q * 3  # sharper maps: far tokens get weights that differ between the window/horizon choices
    response = torch.zeros(n, dtype=torch.bool)
    response[[5, 40, 100, 101, 102]] = True
    span, w, f = streaming_head_stats(q, k, response_mask=response, block_size=37)
    maps = attention_from_qk(q, k)
    for h in range(2):
        s_ref, w_ref, f_ref = loop_stats(maps[h], response, 10, 10, 100)
        assert span[h].item() == pytest.approx(s_ref, rel=1e-12)
        torch.testing.assert_close(w[h], torch.tensor(w_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(f[h], torch.tensor(f_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_head_stats_with_one_response_token_and_with_none():
    q, k = random_qk(heads=3, kv_heads=3, n=7, d=4, seed=2)
    maps = attention_from_qk(q, k)
    one = torch.zeros(7, dtype=torch.bool)
    one[6] = True  # the last token
    span, w, f = streaming_head_stats(q, k, response_mask=one, window=2, h_lo=1, h_hi=3, block_size=2)
    for h in range(3):
        s_ref, w_ref, f_ref = loop_stats(maps[h], one, 2, 1, 3)
        assert span[h].item() == pytest.approx(s_ref, rel=1e-12)
        torch.testing.assert_close(w[h], torch.tensor(w_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(f[h], torch.tensor(f_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    # FAI of s = 3, 4, 5 reads only A[6, s]: one row, divided by a count of 1.
    torch.testing.assert_close(f[:, 3:6], maps[:, 6, 3:6], rtol=0, atol=1e-15)
    span, _, f = streaming_head_stats(q, k, response_mask=torch.zeros(7, dtype=torch.bool), window=2, h_lo=1, h_hi=3)
    assert span.tolist() == [0.0, 0.0, 0.0] and (f == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_stats_of_low_precision_states_are_float32(dtype):
    q, k = random_qk(2, heads=2, kv_heads=1, n=9, d=4, seed=3, dtype=dtype)
    span, w, f = streaming_head_stats(q, k, window=3, h_lo=1, h_hi=4, block_size=4)
    assert span.dtype == w.dtype == f.dtype == torch.float32
    assert span.shape == (2, 2) and w.shape == f.shape == (2, 2, 9)
    maps = attention_from_qk(q.double(), k.double())
    ref = [head_span(maps, None)[0], torch.stack([waad(a, 3) for a in maps.reshape(-1, 9, 9)]).reshape(2, 2, 9),
           torch.stack([fai(a, None, 1, 4) for a in maps.reshape(-1, 9, 9)]).reshape(2, 2, 9)]
    for a, b in zip((span, w, f), ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_flow_defaults_are_no_threshold_and_normalised():
    n = 20
    q, k = random_qk(heads=3, kv_heads=1, n=n, d=4, seed=8)
    question, answer = torch.arange(n) < 4, torch.arange(n) >= 17
    dense = flow_throughput(attention_from_qk(q, k), question, answer, edge_threshold=0.0, normalize=True)
    streamed = streaming_flow_throughput(q, k, question, answer)
    torch.testing.assert_close(streamed, dense, rtol=0, atol=1e-12)
    assert streamed.dtype == torch.float64 and streamed.shape == (n,)
    unnormalised = flow_throughput(attention_from_qk(q, k), question, answer, normalize=False)
    assert (unnormalised - dense).abs().max() > 1e-3, "normalising must matter for this input"


@pytest.mark.parametrize("block_size,heads_per_step", [(1, 1), (2, 3), (5, 2)])
def test_flow_of_uniform_maps_with_an_edge_exactly_at_the_threshold(block_size, heads_per_step):
    # Zero states: every row t attends 1/(t+1) to each s <= t (exact in float), so C[k, i] = 1/(k+1).
    # At threshold 1/4, unnormalised: edges into tokens 1, 2, 3 stay, those into 4 (1/5) go. Answer {3}:
    # h = [1/2, 1/3, 1/4, 1, 0]; W'_01 = 1/3, W'_02 = 1/6, W'_03 = 1/2, W'_12 = 1/4, W'_13 = 3/4, W'_23 = 1;
    # f = [1, 1/3, 1/6 + 1/12, 1/2 + 1/4 + 1/4, 0]. Masks given as 0/1 ints.
    q = torch.zeros(2, 3, 5, 4, dtype=torch.float64)
    question = torch.tensor([1, 0, 0, 0, 0])
    answer = torch.tensor([0, 0, 0, 1, 0])
    f = streaming_flow_throughput(q, q[:, :1], question, answer, edge_threshold=0.25, normalize=False,
                                  block_size=block_size, heads_per_step=heads_per_step)
    torch.testing.assert_close(f, torch.tensor([1.0, 1 / 3, 1 / 4, 1.0, 0.0], dtype=torch.float64),
                               rtol=1e-14, atol=1e-15)


def test_flow_without_a_reachable_answer_is_zero():
    n = 8
    q, k = random_qk(heads=2, kv_heads=1, n=n, d=3, seed=9)
    question = torch.zeros(n, dtype=torch.bool)
    question[-1] = True  # the question comes last: nothing after it, it is not an answer
    answer = torch.zeros(n, dtype=torch.bool)
    answer[0] = True
    assert streaming_flow_throughput(q, k, question, answer, block_size=3).tolist() == [0.0] * n
