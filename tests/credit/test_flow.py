"""FlowTracer (arXiv 2606.10646): answer-conditioned flow, conservation, dead ends, flow_gamma."""

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
from tests.credit._helpers import random_attention


def chain_with_dead_end():
    # Tokens: 0 = question, 1 = a, 2 = c (dead end), 3 = b, 4 = answer.
    # Each token puts 0.5 on itself and 0.5 on its parent: a->question, c->a, b->a, answer->b.
    # Nobody attends to c, so c cannot reach the answer.
    A = torch.zeros(5, 5, dtype=torch.float64)
    A[0, 0] = 1.0
    for child, parent in [(1, 0), (2, 1), (3, 1), (4, 3)]:
        A[child, child] = A[child, parent] = 0.5
    question = torch.tensor([True, False, False, False, False])
    answer = torch.tensor([False, False, False, False, True])
    return A, question, answer


@pytest.mark.parametrize("normalize", [True, False])
def test_chain_carries_all_flow_and_dead_end_none(normalize):
    # Raw capacities q->a, a->c, a->b, b->ans are 0.5. Unnormalised: h(ans) = 1, h(b) = 0.5,
    # h(c) = 0, h(a) = 0.5 * 0.5 = 0.25, h(q) = 0.125, and W'_ab = 0.5 * 0.5 / 0.25 = 1, W'_ac = 0.
    # Normalised: W_ac = W_ab = 0.5, others 1; h(b) = 1, h(a) = 0.5, h(q) = 0.5, W'_ab = 1 again.
    # Either way all of the question's unit of flow goes q -> a -> b -> answer.
    A, question, answer = chain_with_dead_end()
    f = flow_throughput(A, question, answer, normalize=normalize)
    torch.testing.assert_close(f, torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    h = answer_potential(flow_capacity(A, normalize=normalize), answer)
    expected_h = [0.5, 0.5, 0.0, 1.0, 1.0] if normalize else [0.125, 0.25, 0.0, 0.5, 1.0]
    torch.testing.assert_close(h, torch.tensor(expected_h, dtype=torch.float64))


def naive_throughput(attention, question, answer, edge_threshold, normalize):
    """Explicit loops: capacities, backward sweep for h, forward sweep for f."""
    n = attention.shape[-1]
    mean = attention.reshape(-1, n, n).mean(0)
    cap = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for k in range(i + 1, n):
            c = float(mean[k, i])
            cap[i][k] = c if c >= edge_threshold else 0.0
        total = sum(cap[i])
        if normalize and total > 0:
            cap[i] = [c / total for c in cap[i]]
    h = [0.0] * n
    for i in reversed(range(n)):
        h[i] = 1.0 if answer[i] else sum(cap[i][k] * h[k] for k in range(i + 1, n))
    sources = [i for i in range(n) if question[i] and h[i] > 0]
    f = [1.0 / len(sources) if i in sources else 0.0 for i in range(n)]
    for i in range(n):  # f[i] is final once all its predecessors are done
        if answer[i] or h[i] == 0:
            continue
        for k in range(i + 1, n):
            f[k] += f[i] * cap[i][k] * h[k] / h[i]
    return torch.tensor(f, dtype=torch.float64)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("edge_threshold", [0.0, 0.05])
def test_matches_loop_reference(normalize, edge_threshold):
    attention = random_attention(3, n=16, seed=2)  # averaged over the 3 heads
    question = torch.zeros(16, dtype=torch.bool)
    question[1:4] = True
    answer = torch.zeros(16, dtype=torch.bool)
    answer[12:14] = True
    out = flow_throughput(attention, question, answer, edge_threshold=edge_threshold, normalize=normalize)
    expected = naive_throughput(attention, question, answer, edge_threshold, normalize)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flow_conservation_on_random_attention(normalize, seed):
    n = 24
    attention = random_attention(4, n=n, seed=seed)
    question = torch.zeros(n, dtype=torch.bool)
    question[2:6] = True
    answer = torch.zeros(n, dtype=torch.bool)
    answer[18:21] = True  # tokens 21..23 come after the answer: they cannot reach it
    capacity = flow_capacity(attention, edge_threshold=0.02, normalize=normalize)
    h = answer_potential(capacity, answer)
    reweighted = doob_transform(capacity, h, answer)
    live = ~answer & (h > 0)
    torch.testing.assert_close(reweighted.sum(1)[live], torch.ones(int(live.sum()), dtype=torch.float64))
    assert bool((reweighted.sum(1)[~live] == 0).all())
    assert bool((h[21:] == 0).all())
    f = forward_flow(reweighted, h, question)
    assert f[answer].sum().item() == pytest.approx(1.0, abs=1e-12)  # all flow reaches the answer
    assert bool((f >= -1e-15).all()) and bool((f <= 1 + 1e-12).all())
    assert bool((f[21:] == 0).all()) and bool((f[:2] == 0).all())  # before the question: no flow


def test_unreachable_answer_gives_zero_throughput():
    attention = torch.eye(6, dtype=torch.float64)  # nobody attends to anybody else: no edges
    question = torch.tensor([True, True, False, False, False, False])
    answer = torch.tensor([False, False, False, False, True, True])
    assert bool((flow_throughput(attention, question, answer) == 0).all())


def test_flow_gamma_hand_worked():
    # 5 response tokens (token 0 is the prompt), q = 0.4 -> round(2) = 2 tokens: throughputs
    # 0.9 (t=3) and 0.5 (t=1) get gamma_flow.
    throughput = torch.tensor([0.0, 0.5, 0.1, 0.9, 0.3, 0.0])
    response = torch.tensor([False, True, True, True, True, True])
    out = flow_gamma(throughput, response_mask=response)
    torch.testing.assert_close(out, torch.tensor([1, 1.5, 1, 1.5, 1, 1]))
    adv = torch.tensor([0.0, -1.0, 1.0, 1.0, 1.0, 1.0])
    out = flow_gamma(throughput, response_mask=response, advantages=adv, sign_mode="positive", gamma_flow=2.0)
    torch.testing.assert_close(out, torch.tensor([1, 1, 1, 2.0, 1, 1]))
    # Zero throughput is never selected: a row whose answer is unreachable keeps all ones.
    torch.testing.assert_close(flow_gamma(torch.zeros(6)), torch.ones(6))


def test_flow_gamma_properties():
    g = torch.Generator().manual_seed(3)
    throughput = torch.rand(4, 50, generator=g, dtype=torch.float64).requires_grad_()
    response = torch.rand(4, 50, generator=g) < 0.7
    out = flow_gamma(throughput, response_mask=response, q=0.3, gamma_flow=1.5)
    assert out.shape == (4, 50) and not out.requires_grad
    assert set(out.unique().tolist()) <= {1.0, 1.5}
    assert bool((out[~response] == 1).all())
    for b in range(4):
        n = int(response[b].sum())
        chosen = out[b] > 1
        assert int(chosen.sum()) == int(0.3 * n + 0.5)
        # Every chosen token has at least the throughput of every unchosen response token.
        assert throughput[b][chosen].min() >= throughput[b][response[b] & ~chosen].max()
