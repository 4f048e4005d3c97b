"""FlowTracer: answer-conditioned information flow through attention (arXiv 2606.10646).

Tokens form a DAG with an edge ``i -> k`` (``i < k``) whose capacity is the attention token ``k``
pays to token ``i``. A Doob h-transform conditions the flow on reaching the answer, one unit of flow
is pushed from the question, and each token's throughput is its credit.

The forward steps, in one place (``Ans`` = answer tokens, ``Q`` = question tokens):

    C_ik  = Abar[k, i] if i < k and Abar[k, i] >= edge_threshold else 0      (capacity)
    W_ik  = C_ik / sum_k' C_ik'   (normalize=True) or C_ik (normalize=False)
    h(a)  = 1 for a in Ans;  h(i) = sum_k W_ik h(k) otherwise                 (backward sweep)
    W'_ik = W_ik h(k) / h(i)     for i not in Ans with h(i) > 0, else 0       (Doob transform)
    f(k)  = src(k) + sum_i f(i) W'_ik,  src = 1/|Q+| on Q+ = {q in Q : h(q) > 0} (forward sweep)

Answer tokens are absorbing (their flow goes to the virtual super-sink), so ``sum_{a in Ans} f(a)
= 1`` whenever ``Q+`` is not empty, and ``sum_k W'_ik = 1`` for every non-answer ``i`` with
``h(i) > 0``.

Inferred details (the method section was not available; exposed as keywords): ``Abar`` is the plain
mean over the given layers and heads; the threshold drops weak capacities before normalising;
``normalize=True`` makes ``W`` a Markov kernel over outgoing edges (``h`` = probability that a
walk from ``i`` along attention reaches the answer), ``normalize=False`` keeps raw capacities
(``h`` = attention-path weight from ``i`` to the answer; bounded by ``|Ans|`` because each row of
``Abar`` sums to at most 1); the source is uniform over the question tokens that can reach the
answer (the others would only leak flow); with no such token the throughput is all zeros.
"""

from __future__ import annotations

import torch

from credo.credit._select import apply_sign_mode, response_rows, top_fraction_mask

__all__ = [
    "flow_capacity",
    "answer_potential",
    "doob_transform",
    "forward_flow",
    "flow_throughput",
    "flow_gamma",
]


def _check_token_mask(name: str, mask: torch.Tensor, n: int) -> torch.Tensor:
    if mask.shape != (n,):
        raise ValueError(f"{name} has shape {list(mask.shape)}, expected [{n}] (one per token)")
    return mask.bool()


def flow_capacity(
    attention: torch.Tensor, *, edge_threshold: float = 0.0, normalize: bool = True
) -> torch.Tensor:
    """Edge weights ``W`` of the influence DAG (arXiv 2606.10646, Sec. 2.1).

    Args:
        attention: ``[..., N, N]`` causal row-stochastic maps (row = query); averaged over the
            leading dimensions (layers, heads).
        edge_threshold: capacities below this value are dropped (set to 0) before normalising.
        normalize: divide each node's outgoing capacities by their sum (nodes without outgoing
            edges keep an all-zero row).

    Returns:
        ``[N, N]`` float64 ``W`` with ``W[i, k]`` the weight of edge ``i -> k``, zero unless
        ``i < k``.
    """
    if attention.dim() < 2 or attention.shape[-1] != attention.shape[-2]:
        raise ValueError(f"attention has shape {list(attention.shape)}, expected [..., N, N]")
    n = attention.shape[-1]
    mean = attention.detach().reshape(-1, n, n).mean(dim=0, dtype=torch.float64)
    capacity = torch.tril(mean, diagonal=-1).T  # [i, k] = Abar[k, i] for i < k
    capacity = torch.where(capacity >= edge_threshold, capacity, torch.zeros_like(capacity))
    if normalize:
        out = capacity.sum(dim=1, keepdim=True)
        normalised = capacity / out.clamp(min=1e-300)
        capacity = torch.where(out > 0, normalised, torch.zeros_like(capacity))
    return capacity


def answer_potential(capacity: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """Answer-reaching potential ``h`` (backward sweep on the DAG, arXiv 2606.10646, Sec. 2.2).

        h(a) = 1 for a in Ans,   h(i) = sum_{k > i} W_ik h(k) otherwise

    Solved as the unit upper-triangular system ``(I - diag(not Ans) W) h = 1[Ans]``.

    Args:
        capacity: ``[N, N]`` ``W`` from :func:`flow_capacity`.
        answer_mask: ``[N]`` bool answer tokens.

    Returns:
        ``[N]`` float64 ``h``.
    """
    n = capacity.shape[-1]
    answer = _check_token_mask("answer_mask", answer_mask, n)
    propagating = (~answer).to(capacity.dtype)
    eye = torch.eye(n, dtype=capacity.dtype, device=capacity.device)
    system = eye - propagating[:, None] * capacity
    rhs = answer.to(capacity.dtype)[:, None]
    return torch.linalg.solve_triangular(system, rhs, upper=True)[:, 0]


def doob_transform(
    capacity: torch.Tensor, potential: torch.Tensor, answer_mask: torch.Tensor
) -> torch.Tensor:
    """Answer-conditioned weights ``W'_ik = W_ik h(k) / h(i)`` (arXiv 2606.10646, Sec. 2.2).

    Rows of answer tokens (absorbing) and of tokens with ``h(i) = 0`` (removed) are zero; every
    other row sums to 1.

    Args:
        capacity: ``[N, N]`` ``W``.
        potential: ``[N]`` ``h`` from :func:`answer_potential`.
        answer_mask: ``[N]`` bool answer tokens.

    Returns:
        ``[N, N]`` ``W'``.
    """
    n = capacity.shape[-1]
    answer = _check_token_mask("answer_mask", answer_mask, n)
    live = (~answer) & (potential > 0)
    inverse = torch.where(live, 1.0 / potential.clamp(min=1e-300), torch.zeros_like(potential))
    return capacity * potential[None, :] * inverse[:, None]


def forward_flow(
    reweighted: torch.Tensor, potential: torch.Tensor, question_mask: torch.Tensor
) -> torch.Tensor:
    """Push one unit of flow from the question along ``W'`` (arXiv 2606.10646, Sec. 2.3).

        f(k) = src(k) + sum_{i < k} f(i) W'_ik,   src = 1/|Q+| on Q+ = {q in Q : h(q) > 0}

    Solved as the unit lower-triangular system ``(I - W'^T) f = src``.

    Args:
        reweighted: ``[N, N]`` ``W'`` from :func:`doob_transform`.
        potential: ``[N]`` ``h`` (selects the question tokens that can reach the answer).
        question_mask: ``[N]`` bool question tokens.

    Returns:
        ``[N]`` float64 throughput ``f`` (all zeros if no question token reaches the answer).
    """
    n = reweighted.shape[-1]
    question = _check_token_mask("question_mask", question_mask, n) & (potential > 0)
    source = question.to(reweighted.dtype) / question.sum().clamp(min=1)
    system = torch.eye(n, dtype=reweighted.dtype, device=reweighted.device) - reweighted.T
    return torch.linalg.solve_triangular(system, source[:, None], upper=False)[:, 0]


def flow_throughput(
    attention: torch.Tensor,
    question_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    edge_threshold: float = 0.0,
    normalize: bool = True,
) -> torch.Tensor:
    """Throughput of every token in the answer-conditioned attention flow (arXiv 2606.10646).

    Runs :func:`flow_capacity`, :func:`answer_potential`, :func:`doob_transform` and
    :func:`forward_flow`; see the module docstring for the equations and inferred details. Needs
    the dense maps; :func:`credo.credit.streaming.streaming_flow_throughput` computes the same from
    query/key states in ``O(block * N)`` memory.

    Args:
        attention: ``[..., N, N]`` causal row-stochastic maps of one sequence, averaged over the
            leading dimensions.
        question_mask: ``[N]`` bool question tokens (the super-source attaches here).
        answer_mask: ``[N]`` bool answer tokens (the super-sink attaches here).
        edge_threshold: drop capacities below this value.
        normalize: row-normalise capacities over outgoing edges.

    Returns:
        ``[N]`` throughput in ``[0, 1]`` (float64), detached.
    """
    capacity = flow_capacity(attention, edge_threshold=edge_threshold, normalize=normalize)
    potential = answer_potential(capacity, answer_mask)
    reweighted = doob_transform(capacity, potential, answer_mask)
    return forward_flow(reweighted, potential, question_mask)


def flow_gamma(
    throughput: torch.Tensor,
    *,
    response_mask: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    q: float = 0.4,
    gamma_flow: float = 1.5,
    sign_mode: str = "both",
) -> torch.Tensor:
    """Advantage multipliers from flow throughput (arXiv 2606.10646, Sec. 2.4).

        gamma_t = 1 + (gamma_flow - 1) * 1[t in TopQ(f)],    A~_t = gamma_t * A_t

    ``TopQ`` takes the nearest-integer ``q`` share of the response tokens of each row (ties by
    position) and never selects a token with zero throughput (it carries no question-to-answer
    flow), so a row whose answer is unreachable gets all ones. ``q=0.4`` and ``sign_mode="both"``
    are inferred from the companion paper 2510.13554; ``gamma_flow=1.5`` is the paper's value.

    Args:
        throughput: ``[..., N]`` from :func:`flow_throughput`.
        response_mask: ``[..., N]`` bool selectable tokens (all when None).
        advantages: ``[..., N]``; needed only for ``sign_mode != "both"``.
        q: selected share of response tokens.
        gamma_flow: amplification factor.
        sign_mode: ``"both"``, ``"positive"`` (``A >= 0``) or ``"negative"`` (``A < 0``).

    Returns:
        ``[..., N]`` detached multipliers in ``{1, gamma_flow}`` (dtype of ``throughput``).
    """
    throughput = throughput.detach()
    rows = response_rows(response_mask, throughput.shape, throughput.device)
    selected = top_fraction_mask(throughput, rows, q) & (throughput > 0)
    gamma = torch.where(
        selected, torch.full_like(throughput, gamma_flow), torch.ones_like(throughput)
    )
    return apply_sign_mode(gamma, advantages, sign_mode).detach()
