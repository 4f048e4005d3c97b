"""FlowTracer's steps at their boundaries: thresholds hit exactly, defaults, dtypes, masks of other dtypes.

Every expected value is worked by hand from the equations of :mod:`credo.credit.flow`.
"""

from __future__ import annotations

import pytest
import torch

from credo.credit.flow import (
    answer_potential,
    doob_transform,
    flow_capacity,
    flow_gamma,
    flow_throughput,
    forward_flow,
)

F64 = torch.float64


def three_token_map():
    # Row = query. Token 1 pays 0.25 to token 0; token 2 pays 0.5 to token 0 and 0.25 to token 1.
    return torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.5, 0.25, 0.25]], dtype=F64)


def test_capacity_is_the_transposed_strict_lower_triangle_of_the_mean_map():
    a = three_token_map()
    b = torch.tensor([[1.0, 0.0, 0.0], [0.75, 0.25, 0.0], [0.0, 0.75, 0.25]], dtype=F64)
    cap = flow_capacity(torch.stack([a, b]), normalize=False)  # mean over the leading dim
    expected = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(cap, expected, rtol=0, atol=0)
    assert cap.dtype == F64 and cap.shape == (3, 3)


def test_capacity_defaults_keep_every_edge_and_normalise_rows():
    # Default edge_threshold 0.0 keeps the 0.25 edges; default normalize=True divides row 0 by 0.75.
    cap = flow_capacity(three_token_map())
    expected = torch.tensor([[0.0, 1 / 3, 2 / 3], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(cap, expected, rtol=1e-15, atol=0)


def test_an_edge_exactly_at_the_threshold_is_kept():
    cap = flow_capacity(three_token_map(), edge_threshold=0.25, normalize=False)
    expected = torch.tensor([[0.0, 0.25, 0.5], [0.0, 0.0, 0.25], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(cap, expected, rtol=0, atol=0)
    # Just above it both 0.25 edges go; row 1 has no edge left and stays zero when normalising.
    cap = flow_capacity(three_token_map(), edge_threshold=0.3)
    expected = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(cap, expected, rtol=0, atol=0)


def test_tiny_capacities_are_normalised_not_floored():
    # A row whose outgoing capacities sum to 1e-200 still normalises to 1 (the clamp is only a 0-guard).
    a = torch.tensor([[1.0, 0.0], [1e-200, 1.0]], dtype=F64)
    cap = flow_capacity(a)
    torch.testing.assert_close(cap, torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64), rtol=0, atol=0)


def test_capacity_of_a_float32_map_is_float64_and_detached():
    a = three_token_map().float().requires_grad_()
    cap = flow_capacity(a, normalize=False)
    assert cap.dtype == F64 and not cap.requires_grad
    assert cap[0, 2].item() == 0.5


@pytest.mark.parametrize("shape", [(4,), (2, 3), (3, 4, 5)])
def test_capacity_names_a_map_that_is_not_square(shape):
    dims = ", ".join(str(s) for s in shape)
    with pytest.raises(ValueError, match=rf"^attention has shape \[{dims}\], expected \[\.\.\., N, N\]$"):
        flow_capacity(torch.zeros(shape))


def test_potential_by_hand_and_as_float64():
    # W = [[0, .5, .25], [0, 0, .5], [0, 0, 0]]; answer = {2}: h2 = 1, h1 = .5, h0 = .5 * .5 + .25 = .5
    cap = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=F64)
    h = answer_potential(cap, torch.tensor([False, False, True]))
    torch.testing.assert_close(h, torch.tensor([0.5, 0.5, 1.0], dtype=F64), rtol=0, atol=0)
    # Answer tokens are absorbing: token 1 as an answer has h = 1 whatever its own edges.
    h = answer_potential(cap, torch.tensor([0, 1, 1]))  # an int mask is read as bool
    torch.testing.assert_close(h, torch.tensor([0.75, 1.0, 1.0], dtype=F64), rtol=0, atol=0)
    # The first token as the answer.
    h = answer_potential(cap, torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(h, torch.tensor([1.0, 0.0, 0.0], dtype=F64), rtol=0, atol=0)


@pytest.mark.parametrize("fn", ["potential", "doob"])
def test_potential_and_doob_name_a_misshapen_answer_mask(fn):
    cap = torch.zeros(3, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"^answer_mask has shape \[2\], expected \[3\] \(one per token\)$"):
        if fn == "potential":
            answer_potential(cap, torch.ones(2, dtype=torch.bool))
        else:
            doob_transform(cap, torch.ones(3, dtype=F64), torch.ones(2, dtype=torch.bool))


def test_doob_rows_by_hand():
    cap = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.5, 0.5, 1.0], dtype=F64)
    w = doob_transform(cap, h, torch.tensor([0, 0, 1]))  # an int mask is read as bool
    # W'_01 = .5 * .5 / .5 = .5, W'_02 = .25 * 1 / .5 = .5, W'_12 = .5 * 1 / .5 = 1
    expected = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected, rtol=0, atol=0)


def test_doob_zeroes_the_rows_of_answers_and_of_tokens_without_potential():
    cap = torch.tensor([[0.0, 0.5, 0.25], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=F64)
    # Token 0 has h = 0 (given, e.g. a token that was removed): its row is zero although h(1), h(2) > 0.
    h = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    w = doob_transform(cap, h, torch.tensor([False, False, True]))
    expected = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected, rtol=0, atol=0)
    # Token 1 is an answer: its row is zero even with h(1) > 0 and an edge 1 -> 2.
    w = doob_transform(cap, torch.tensor([0.75, 1.0, 1.0], dtype=F64), torch.tensor([False, True, True]))
    expected = torch.tensor([[0.0, 0.5 / 0.75, 0.25 / 0.75], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected, rtol=1e-15, atol=0)


def test_doob_divides_by_a_tiny_potential_exactly():
    cap = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64)
    w = doob_transform(cap, torch.tensor([1e-200, 1e-200], dtype=F64), torch.tensor([False, True]))
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64), rtol=1e-15, atol=0)


def test_forward_flow_splits_the_source_over_the_question_tokens_that_reach_the_answer():
    # W' = [[0, .5, .5], [0, 0, 1], [0, 0, 0]]; question = {0, 1}, both with h > 0: src = 1/2 each.
    w = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.5, 0.5, 1.0], dtype=F64)
    f = forward_flow(w, h, torch.tensor([1, 1, 0]))  # an int mask is read as bool
    torch.testing.assert_close(f, torch.tensor([0.5, 0.75, 1.0], dtype=F64), rtol=0, atol=0)
    assert f.dtype == F64
    # Token 1 cannot reach the answer (h = 0): the whole unit starts at token 0.
    f = forward_flow(w, torch.tensor([0.5, 0.0, 1.0], dtype=F64), torch.tensor([True, True, False]))
    torch.testing.assert_close(f, torch.tensor([1.0, 0.5, 1.0], dtype=F64), rtol=0, atol=0)
    # A single question token: the unit is not split.
    f = forward_flow(w, h, torch.tensor([False, True, False]))
    torch.testing.assert_close(f, torch.tensor([0.0, 1.0, 1.0], dtype=F64), rtol=0, atol=0)
    # No question token reaches the answer: all zeros (no division by zero).
    f = forward_flow(w, torch.zeros(3, dtype=F64), torch.tensor([True, True, False]))
    assert f.tolist() == [0.0, 0.0, 0.0]


def test_forward_flow_names_a_misshapen_question_mask():
    with pytest.raises(ValueError, match=r"^question_mask has shape \[2, 2\], expected \[3\] \(one per token\)$"):
        forward_flow(torch.zeros(3, 3, dtype=F64), torch.ones(3, dtype=F64), torch.ones(2, 2, dtype=torch.bool))


def test_throughput_defaults_and_threshold_by_hand():
    a = three_token_map()
    question = torch.tensor([True, False, False])
    answer = torch.tensor([False, False, True])
    # Normalised W = [[0, 1/3, 2/3], [0, 0, 1], 0]: h = 1 everywhere, f = [1, 1/3, 1].
    f = flow_throughput(a, question, answer)
    torch.testing.assert_close(f, torch.tensor([1.0, 1 / 3, 1.0], dtype=F64), rtol=1e-15, atol=0)
    # At a threshold of 0.3 the edges 0->1 and 1->2 (0.25 each) go: the flow skips token 1.
    f = flow_throughput(a, question, answer, edge_threshold=0.3)
    torch.testing.assert_close(f, torch.tensor([1.0, 0.0, 1.0], dtype=F64), rtol=0, atol=0)
    # Unnormalised: W = [[0, .25, .5], [0, 0, .25], 0], h = [.25 * .25 + .5, .25, 1] = [9/16, 1/4, 1],
    # W'_01 = .25 * (1/4) / (9/16) = 1/9, W'_12 = 1: f = [1, 1/9, 8/9 + 1/9].
    f = flow_throughput(a, question, answer, normalize=False)
    torch.testing.assert_close(f, torch.tensor([1.0, 1 / 9, 1.0], dtype=F64), rtol=1e-15, atol=1e-16)


def test_flow_gamma_defaults_by_hand():
    # 5 selectable tokens, default q = 0.4 -> 2 chosen, default gamma 1.5, default sign_mode "both".
    throughput = torch.tensor([0.2, 0.7, 0.1, 0.6, 0.3], dtype=F64)
    out = flow_gamma(throughput)
    assert out.dtype == F64
    assert out.tolist() == [1.0, 1.5, 1.0, 1.5, 1.0]
    # A negative advantage under "both" is amplified too.
    out = flow_gamma(throughput, advantages=-torch.ones(5, dtype=F64))
    assert out.tolist() == [1.0, 1.5, 1.0, 1.5, 1.0]


def test_flow_gamma_negative_sign_mode_and_ties_by_position():
    throughput = torch.tensor([0.5, 0.5, 0.5, 0.5])
    adv = torch.tensor([-1.0, 0.0, -2.0, 1.0])
    # q = 0.5 of 4 -> 2 tokens, ties broken by position: tokens 0 and 1; "negative" keeps A < 0 only.
    out = flow_gamma(throughput, advantages=adv, q=0.5, gamma_flow=3.0, sign_mode="negative")
    assert out.tolist() == [3.0, 1.0, 1.0, 1.0]
    out = flow_gamma(throughput, advantages=adv, q=0.5, gamma_flow=3.0, sign_mode="positive")
    assert out.tolist() == [1.0, 3.0, 1.0, 1.0]


def test_flow_gamma_never_selects_zero_throughput():
    # q = 1 asks for all 4, but the two zero-throughput tokens carry no flow and stay at 1.
    out = flow_gamma(torch.tensor([0.0, 0.3, 0.0, 0.2]), q=1.0, gamma_flow=2.0)
    assert out.tolist() == [1.0, 2.0, 1.0, 2.0]
