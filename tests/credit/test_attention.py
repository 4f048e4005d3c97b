"""Preplan-and-anchor credit (arXiv 2510.13554): head span, WAAD, FAI and rhythm_gamma."""

from __future__ import annotations

import pytest
import torch

from credo.credit.attention import (
    attention_rhythm_gamma,
    fai,
    group_heads,
    head_span,
    rhythm_gamma,
    waad,
)
from tests.credit._helpers import random_attention

# A 4-token causal, row-stochastic map (row = query t, column = key s).
A = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.2, 0.3, 0.5, 0.0],
        [0.4, 0.1, 0.2, 0.3],
    ],
    dtype=torch.float64,
)


def test_head_span_and_grouping_hand_worked():
    # Head 0 attends to itself only: span 0. Head 1: row 1 looks 1 back, row 2 looks 2 back with
    # 0.5 and 1 back with 0.5 (distance 1.5). Span over all rows (0 + 1 + 1.5) / 3; over response
    # rows {1, 2}: (1 + 1.5) / 2 = 1.25.
    identity = torch.eye(3, dtype=torch.float64)
    far = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0.5, 0.5, 0]], dtype=torch.float64)
    maps = torch.stack([identity, far])
    span, local, global_ = head_span(maps, quantile=0.5)
    torch.testing.assert_close(span, torch.tensor([0.0, 2.5 / 3], dtype=torch.float64))
    assert local.tolist() == [True, False] and global_.tolist() == [False, True]
    span, _, _ = head_span(maps, torch.tensor([False, True, True]))
    torch.testing.assert_close(span, torch.tensor([0.0, 1.25], dtype=torch.float64))


def test_group_heads_over_layers_and_heads():
    # 2 layers x 3 heads; 30% of 6 heads = 1.8 -> 2 heads per group.
    span = torch.tensor([[5.0, 1.0, 9.0], [0.5, 7.0, 3.0]])
    local, global_ = group_heads(span, quantile=0.3)
    assert local.tolist() == [[False, True, False], [True, False, False]]
    assert global_.tolist() == [[False, False, True], [False, True, False]]


def test_waad_hand_worked():
    # W = 2: row 1: 0.5 * 1; row 2: 0.2 * min(2, 2) + 0.3 * 1 = 0.7;
    # row 3: 0.4 * min(3, 2) + 0.1 * 2 + 0.2 * 1 = 1.2. With W = 10 row 3 is 0.4 * 3 + 0.2 + 0.2.
    torch.testing.assert_close(waad(A, window=2), torch.tensor([0, 0.5, 0.7, 1.2], dtype=torch.float64))
    torch.testing.assert_close(waad(A, window=10), torch.tensor([0, 0.5, 0.7, 1.6], dtype=torch.float64))
    # Leading dimensions are averaged: WAAD is linear in the map.
    B = torch.eye(4, dtype=torch.float64)  # WAAD 0 everywhere
    torch.testing.assert_close(waad(torch.stack([A, B]), window=2), waad(A, window=2) / 2)


def test_fai_hand_worked():
    # h_lo = 1, h_hi = 2, all rows: s=0 -> rows {1, 2}: (0.5 + 0.2) / 2; s=1 -> rows {2, 3}:
    # (0.3 + 0.1) / 2; s=2 -> row {3}: 0.2; s=3 -> no row: 0.
    torch.testing.assert_close(fai(A, h_lo=1, h_hi=2), torch.tensor([0.35, 0.2, 0.2, 0], dtype=torch.float64))
    # h_hi = 3 and response rows {2, 3} only: s=0 -> rows {2, 3}: (0.2 + 0.4) / 2 = 0.3;
    # s=1 -> (0.3 + 0.1) / 2; s=2 -> 0.2; s=3 -> 0.
    response = torch.tensor([False, False, True, True])
    torch.testing.assert_close(
        fai(A, response, h_lo=1, h_hi=3), torch.tensor([0.3, 0.2, 0.2, 0], dtype=torch.float64)
    )


# Hand-built rhythm: 8 response tokens, q = 0.25 -> 2 tokens per selection.
# Delta_t = |WAAD_t - WAAD_t+1| = [1, 0, 3, 0, 0, 3, 0, 0] (last token: 0) -> TopQ(Delta) = {2, 5}.
# TopQ(FAI) = {1 (0.9), 7 (0.8)}.
WAAD = torch.tensor([0.0, 1, 1, 4, 4, 4, 1, 1])
FAI = torch.tensor([0.1, 0.9, 0.2, 0.3, 0.05, 0.05, 0.6, 0.8])


def test_rhythm_gamma_local_and_global_hand_worked():
    local = rhythm_gamma(WAAD, FAI, strategy="local", q=0.25)
    torch.testing.assert_close(local, torch.tensor([1, 1, 1.5, 1, 1, 1.5, 1, 1]))
    global_ = rhythm_gamma(WAAD, FAI, strategy="global", q=0.25)
    torch.testing.assert_close(global_, torch.tensor([1, 1.5, 1, 1, 1, 1, 1, 1.5]))


def test_rhythm_gamma_coupled_hand_worked():
    # tau_waad = lower median of WAAD = 1; tau_delta = smallest Delta in TopQ(Delta) = 3.
    # Anchor 1: WAAD 1 <= 1, but its window {0} has Delta 1 < 3 -> not dominated: 1.5.
    # Anchor 7: WAAD 1 <= 1 and window {5, 6} (k = 2) has Delta_5 = 3 >= 3 -> dominated, intro 5.
    # alpha = 0.5: anchor 7 gets 1 + 0.5 * 0.5 = 1.25 and token 5 gets 1.25.
    coupled = rhythm_gamma(WAAD, FAI, strategy="coupled", q=0.25, k=2, alpha=0.5)
    torch.testing.assert_close(coupled, torch.tensor([1, 1.5, 1, 1, 1, 1.25, 1, 1.25]))
    # alpha = 1 moves the whole bonus to the introductory token.
    coupled = rhythm_gamma(WAAD, FAI, strategy="coupled", q=0.25, k=2, alpha=1.0)
    torch.testing.assert_close(coupled, torch.tensor([1, 1.5, 1, 1, 1, 1.5, 1, 1]))
    # k = 1: anchor 7's window is {6} with Delta 0: not dominated, plain global credit.
    coupled = rhythm_gamma(WAAD, FAI, strategy="coupled", q=0.25, k=1)
    torch.testing.assert_close(coupled, torch.tensor([1, 1.5, 1, 1, 1, 1, 1, 1.5]))
    # An explicit tau_waad below 1 makes no anchor dominated.
    coupled = rhythm_gamma(WAAD, FAI, strategy="coupled", q=0.25, k=2, tau_waad=0.5)
    torch.testing.assert_close(coupled, torch.tensor([1, 1.5, 1, 1, 1, 1, 1, 1.5]))


def test_rhythm_gamma_sign_modes_and_response_mask():
    adv = torch.tensor([1.0, 1, 1, 1, 1, -1, -1, -1])
    both = rhythm_gamma(WAAD, FAI, q=0.25, k=2)
    positive = rhythm_gamma(WAAD, FAI, q=0.25, k=2, advantages=adv, sign_mode="positive")
    negative = rhythm_gamma(WAAD, FAI, q=0.25, k=2, advantages=adv, sign_mode="negative")
    torch.testing.assert_close(positive, torch.where(adv >= 0, both, 1.0))
    torch.testing.assert_close(negative, torch.where(adv < 0, both, 1.0))
    with pytest.raises(ValueError, match="needs advantages"):
        rhythm_gamma(WAAD, FAI, sign_mode="positive")
    with pytest.raises(ValueError, match=r"^advantages has shape \[3\], expected \[8\] like the per-token scores$"):
        rhythm_gamma(WAAD, FAI, advantages=adv[:3], sign_mode="negative")
    # Token 1 moved to the prompt: never selected, multiplier 1; 7 response tokens, q = 0.25 ->
    # round(1.75) = 2 anchors: 7 (0.8) and 6 (0.6).
    response = torch.ones(8, dtype=torch.bool)
    response[1] = False
    out = rhythm_gamma(WAAD, FAI, strategy="global", q=0.25, response_mask=response)
    torch.testing.assert_close(out, torch.tensor([1, 1, 1, 1, 1, 1, 1.5, 1.5]))


@pytest.mark.parametrize("strategy", ["local", "global", "coupled"])
def test_rhythm_gamma_properties(strategy):
    g = torch.Generator().manual_seed(0)
    waad_b = torch.rand(3, 40, generator=g, dtype=torch.float64).requires_grad_()
    fai_b = torch.rand(3, 40, generator=g, dtype=torch.float64).requires_grad_()
    response = torch.rand(3, 40, generator=g) < 0.8
    out = rhythm_gamma(waad_b, fai_b, strategy=strategy, response_mask=response, alpha=0.3)
    assert out.shape == (3, 40) and not out.requires_grad
    assert bool((out[~response] == 1).all())
    high = 1.5 if strategy != "coupled" else 1 + 1.3 * 0.5
    assert bool(((out >= 1) & (out <= high + 1e-12)).all())
    if strategy != "coupled":
        assert set(out.unique().tolist()) <= {1.0, 1.5}
        for b in range(3):  # round(0.4 * n) tokens selected per row
            assert int((out[b] > 1).sum()) == int(0.4 * int(response[b].sum()) + 0.5)
    for b in range(3):  # rows are independent: batched equals one row at a time
        row = rhythm_gamma(waad_b[b], fai_b[b], strategy=strategy, response_mask=response[b], alpha=0.3)
        torch.testing.assert_close(out[b], row)


def test_attention_rhythm_gamma_composes_the_steps():
    attention = random_attention(2, 4, n=30, seed=1)  # [L, H, N, N]
    response = torch.arange(30) >= 8
    span, local, global_ = head_span(attention, response, quantile=0.25)
    expected = rhythm_gamma(
        waad(attention[local], 5), fai(attention[global_], response, 2, 9), response_mask=response
    )
    out = attention_rhythm_gamma(attention, response, head_quantile=0.25, window=5, h_lo=2, h_hi=9)
    torch.testing.assert_close(out, expected)
    assert int(local.sum()) == int(global_.sum()) == 2
    assert span[local].max() <= span[~local].min()


def test_empty_response_and_local_without_fai():
    # No response rows: spans are 0 and no token is selected.
    maps = random_attention(3, n=6, seed=4)
    span, _, _ = head_span(maps, torch.zeros(6, dtype=torch.bool))
    assert bool((span == 0).all())
    out = rhythm_gamma(WAAD, FAI, response_mask=torch.zeros(8, dtype=torch.bool))
    torch.testing.assert_close(out, torch.ones(8))
    # The local strategy needs no FAI; the others do.
    torch.testing.assert_close(rhythm_gamma(WAAD, None, strategy="local", q=0.25)[[2, 5]], torch.tensor([1.5, 1.5]))
    with pytest.raises(ValueError, match="fai has shape None"):
        rhythm_gamma(WAAD, None, strategy="global")
