"""Kept sets of top-k / top-p / min-p samplers and log-probs renormalised over them (credo.algos.kept_set),
against a brute-force set built token by token in float64 from each rule's definition, ties included; the chunked
`logprobs_from_hidden(kept_threshold=...)` and its gradient against autograd of the plain masked log-softmax."""

import math

import pytest
import torch

from credo.algos import kept_log_probs, kept_mask, kept_set_threshold, logprobs_from_hidden


def brute_force_set(row: list[float], *, top_k: int, top_p: float, min_p: float, order: str) -> set[int]:
    """The kept token ids of one row of scaled logits, each stage written from its definition (tie-closed):
    top-k keeps a token when fewer than k tokens are strictly above it; min-p when p >= min_p * max p; top-p when the
    mass (renormalised over what the earlier stages kept) of the tokens strictly above it is below top_p."""
    kept = set(range(len(row)))
    stages = ("top_k", "top_p", "min_p") if order == "hf" else ("min_p", "top_k", "top_p")
    for stage in stages:
        if stage == "top_k" and top_k > 0:
            kept = {j for j in kept if sum(1 for i in range(len(row)) if row[i] > row[j]) < top_k}
        elif stage == "min_p" and min_p > 0:
            top = max(row)
            kept = {j for j in kept if math.exp(row[j] - top) >= min_p}
        elif stage == "top_p" and top_p < 1:
            total = sum(math.exp(row[i]) for i in kept)
            kept = {j for j in kept if sum(math.exp(row[i]) for i in kept if row[i] > row[j]) / total < top_p}
    return kept


def tied_logits(n: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits rounded to a coarse grid, so most rows hold ties, also at the truncation boundaries."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2).round() / 2


RULES = [
    dict(top_k=3), dict(top_k=1), dict(top_p=0.9), dict(top_p=0.5), dict(top_p=0.05), dict(min_p=0.1),
    dict(min_p=0.5), dict(top_k=5, top_p=0.7), dict(top_p=0.8, min_p=0.2), dict(top_k=4, top_p=0.6, min_p=0.3),
]


@pytest.mark.parametrize("order", ["hf", "vllm"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
@pytest.mark.parametrize("grid", [True, False], ids=["ties", "no_ties"])
def test_kept_set_matches_brute_force(rule, order, grid):
    z = tied_logits(24, 12, 7) if grid else torch.randn(24, 12, generator=torch.Generator().manual_seed(3),
                                                          dtype=torch.float64)
    settings = {**dict(top_k=0, top_p=1.0, min_p=0.0), **rule}
    tau = kept_set_threshold(z, order=order, **settings)
    mask = kept_mask(z.float(), tau)
    for i in range(z.shape[0]):
        expected = brute_force_set(z[i].tolist(), order=order, **settings)
        assert set(torch.nonzero(mask[i])[:, 0].tolist()) == expected, (i, z[i].tolist())


def test_ties_at_the_threshold_are_kept_and_the_threshold_lies_in_the_gap():
    z = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0, -2.0]])
    tau = kept_set_threshold(z, top_k=2)  # the 2nd value (1.0) is tied three ways: all three stay
    assert kept_mask(z, tau)[0].tolist() == [True, True, True, True, False, False]
    assert tau.item() == pytest.approx(((1.0 - 3.0) + (0.0 - 3.0)) / 2)  # halfway to the first dropped value
    assert kept_set_threshold(z, top_k=0, top_p=1.0, min_p=0.0).item() == -math.inf  # nothing cut


def test_hf_warpers_keep_the_same_set_without_ties():
    """credo's hf sampler draws from these sets; without ties they are the sets transformers' own warpers keep."""
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    z = torch.randn(32, 50, generator=torch.Generator().manual_seed(5))
    for top_k, top_p, min_p in [(5, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (8, 0.8, 0.1)]:
        scores = z.clone()
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        if min_p:
            scores = MinPLogitsWarper(min_p)(None, scores)
        tau = kept_set_threshold(z, top_k=top_k, top_p=top_p, min_p=min_p, order="hf")
        assert torch.equal(kept_mask(z, tau), torch.isfinite(scores)), (top_k, top_p, min_p)


@pytest.mark.parametrize("rule", RULES[:7], ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
def test_kept_log_probs_against_brute_force_renormalisation(rule):
    z = tied_logits(16, 10, 11)
    labels = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))
    settings = {**dict(top_k=0, top_p=1.0, min_p=0.0), **rule}
    got = kept_log_probs(z, labels, kept_set_threshold(z, **settings))
    for i in range(16):
        row, y = z[i].tolist(), int(labels[i])
        kept = brute_force_set(row, order="hf", **settings) | {y}  # the sampled token is always scored
        want = row[y] - math.log(sum(math.exp(row[j]) for j in kept))
        assert got[i].item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_kept_log_probs_and_gradient_match_autograd(chunk_size, with_entropy):
    g = torch.Generator().manual_seed(0)
    n, d, vocab, temperature = 13, 6, 17, 0.7
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, d, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (n,), generator=g)
    with torch.no_grad():
        z = (hidden @ weight.T + bias) / temperature
        tau = kept_set_threshold(z, top_k=6, top_p=0.8)
        tau[3] = -math.inf  # a row the sampler did not truncate
        tau[4] = -1e-3  # a threshold tighter than the label's logit: the label is still scored
    upstream = torch.randn(n, generator=g, dtype=torch.float64)
    up_ent = torch.randn(n, generator=g, dtype=torch.float64)

    def naive():
        zz = (hidden @ weight.T + bias) / temperature
        masked = zz.masked_fill(~kept_mask(zz.detach(), tau, labels), -math.inf)
        logp_all = masked.log_softmax(-1)
        lp = logp_all.gather(1, labels[:, None])[:, 0]
        p = logp_all.exp()
        ent = -(p * logp_all.clamp(min=-1e4)).sum(-1)  # the entropy of the kept-set distribution
        return lp, ent

    lp_ref, ent_ref = naive()
    assert torch.allclose(lp_ref, kept_log_probs(z, labels, tau))
    out = logprobs_from_hidden(hidden, weight, labels, temperature=temperature, chunk_size=chunk_size,
                               with_entropy=with_entropy, bias=bias, kept_threshold=tau)
    lp, ent = out if with_entropy else (out, None)
    assert torch.allclose(lp, lp_ref, atol=1e-10)
    loss_ref = (upstream * lp_ref).sum() + ((up_ent * ent_ref).sum() if with_entropy else 0)
    loss = (upstream * lp).sum() + ((up_ent * ent).sum() if with_entropy else 0)
    if with_entropy:
        assert torch.allclose(ent, ent_ref, atol=1e-10)
    grads_ref = torch.autograd.grad(loss_ref, (hidden, weight, bias))
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    for a, b in zip(grads, grads_ref):
        assert torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-10)


def test_no_threshold_is_the_full_softmax():
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(7, 4, generator=g), torch.randn(9, 4, generator=g)
    labels = torch.randint(0, 9, (7,), generator=g)
    full = logprobs_from_hidden(hidden, weight, labels)
    off = logprobs_from_hidden(hidden, weight, labels, kept_threshold=torch.full((7,), -math.inf))
    assert torch.equal(full, off)
    with pytest.raises(ValueError, match="kept_threshold has shape"):
        logprobs_from_hidden(hidden, weight, labels, kept_threshold=torch.zeros(6))
