"""Per-sample seeded sampling (HFBackend(per_sample_seeds=True)): the draws follow the sampling distribution, and a
prompt's tokens depend on its own seed only, not on the batch it shares a generate call with."""

import pytest
import torch
from scipy.stats import chisquare

from credo.distributed.rollout import HFBackend
from credo.distributed.seeded_sampling import SeededGumbelSampler, gumbel_noise, mix32, nucleus_mask, seed_keys
from tests.fakes import sharp_tiny_policy


def draw(logits: torch.Tensor, seeds: list[int], position: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """One token per seed from the same logits [V], through the sampler's own processor call."""
    sampler = SeededGumbelSampler(seeds, 1.0, top_p)
    sampler.position = position
    scores = sampler(torch.zeros(len(seeds), 1, dtype=torch.long), logits.expand(len(seeds), -1).clone())
    return scores.argmax(-1)


def naive_nucleus(probs: list[float], top_p: float) -> list[float]:
    """The top-p distribution by a loop: walk tokens by falling probability, keep while the mass so far < top_p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


def test_mixer_is_a_bijection_and_the_noise_a_pure_function():
    x = torch.arange(1 << 16, dtype=torch.int64) * 65521  # spread over the 32-bit range
    assert mix32(x).unique().numel() == x.numel()
    keys = seed_keys([0, 1, 2**40 + 1, -5])
    assert keys.unique().numel() == 4
    a, b = gumbel_noise(keys, 3, 50), gumbel_noise(keys, 3, 50)
    assert torch.equal(a, b)
    assert not torch.equal(a, gumbel_noise(keys, 4, 50))
    assert torch.isfinite(a).all()


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_draws_follow_the_softmax_by_chi_square(top_p):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = naive_nucleus(logits.softmax(-1).tolist(), top_p)
    n = 40_000
    tokens = draw(logits, list(range(n)), top_p=top_p)
    counts = torch.bincount(tokens, minlength=6).double()
    support = [i for i, p in enumerate(probs) if p > 0]
    assert counts[[i for i in range(6) if i not in support]].sum() == 0  # nothing outside the nucleus
    expected = torch.tensor([probs[i] for i in support], dtype=torch.float64)
    expected = expected / expected.sum() * n
    stat, pvalue = chisquare(counts[support].numpy(), expected.numpy())
    assert pvalue > 1e-3, (counts.tolist(), expected.tolist())
    # and a total-variation bound, the other way of saying it
    assert 0.5 * (counts / n - torch.tensor(probs, dtype=torch.float64)).abs().sum() < 0.01


def test_positions_are_independent():
    """The draws at positions 0 and 1 of one seed: their joint counts against the product of the marginals."""
    logits = torch.tensor([1.0, 0.0, -0.5])
    seeds = list(range(30_000))
    t0, t1 = draw(logits, seeds, position=0), draw(logits, seeds, position=1)
    joint = torch.bincount(t0 * 3 + t1, minlength=9).double()
    p = logits.double().softmax(-1)
    expected = (p[:, None] * p[None, :]).flatten() * len(seeds)
    _, pvalue = chisquare(joint.numpy(), expected.numpy())
    assert pvalue > 1e-3


def test_nucleus_mask_matches_the_loop():
    torch.manual_seed(0)
    logits = torch.randn(20, 12) * 2
    for top_p in (0.3, 0.7, 0.95):
        got = nucleus_mask(logits, top_p).softmax(-1)
        want = torch.tensor([naive_nucleus(row, top_p) for row in logits.softmax(-1).tolist()])
        torch.testing.assert_close(got, want.float(), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 8.0)
    return model, tok


def prompts_of(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_a_prompts_tokens_depend_on_its_seed_only(tiny):
    model, tok = tiny
    prompts = prompts_of(tok, ["1+2=", "33+4=", "7=", "12+34=", "5+5=", "98+76="])
    seeds = [11, 22, 33, 44, 55, 66]
    kw = dict(max_new_tokens=6, temperature=0.8, top_p=0.9)
    backend = HFBackend(model, tok, per_sample_seeds=True)
    whole = backend.generate(prompts, seeds=seeds, **kw)
    assert len({tuple(s.response_ids) for s in whole}) > 1
    alone = [backend.generate([p], seeds=[s], **kw)[0] for p, s in zip(prompts, seeds)]
    order = [5, 2, 0, 4, 1, 3]
    shuffled = backend.generate([prompts[i] for i in order], seeds=[seeds[i] for i in order], **kw)
    blocks = HFBackend(model, tok, per_sample_seeds=True, max_batch=4).generate(prompts, seeds=seeds, **kw)
    for i, s in enumerate(whole):
        assert alone[i].response_ids == s.response_ids == blocks[i].response_ids
        assert shuffled[order.index(i)].response_ids == s.response_ids
        torch.testing.assert_close(torch.tensor(alone[i].rollout_log_probs), torch.tensor(s.rollout_log_probs),
                                   atol=1e-4, rtol=0)  # a row's float sums differ alone and in a batch
    other = backend.generate(prompts, seeds=[s + 1 for s in seeds], **kw)
    assert [s.response_ids for s in other] != [s.response_ids for s in whole]


def test_log_probs_are_the_processed_distributions(tiny):
    """Each recorded log-prob against a teacher-forced forward pass with temperature and top-p applied."""
    model, tok = tiny
    prompts = prompts_of(tok, ["1+2=", "33+4=", "7="]) * 2
    T, top_p = 0.7, 0.9
    samples = HFBackend(model, tok, per_sample_seeds=True).generate(prompts, max_new_tokens=6, temperature=T,
                                                                    top_p=top_p, seeds=[3, 1, 4, 1, 5, 9])
    for s, p in zip(samples, prompts):
        assert s.finished == (tok.eos_token_id in s.response_ids)
        ids = torch.tensor([p + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float() / T
        rows = [naive_nucleus(r, top_p) for r in logits.softmax(-1).tolist()]
        want = [torch.tensor(r)[t].log().item() for r, t in zip(rows, s.response_ids)]
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), torch.tensor(want), atol=2e-4, rtol=0)


def test_first_tokens_of_a_real_model_follow_its_softmax(tiny):
    model, tok = tiny
    prompt = prompts_of(tok, ["4+4="])[0]
    n = 3000
    samples = HFBackend(model, tok, per_sample_seeds=True).generate([prompt] * n, max_new_tokens=1, temperature=1.0,
                                                                    top_p=1.0, seeds=list(range(n)))
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([prompt])).logits[0, -1].float().softmax(-1).double()
    counts = torch.bincount(torch.tensor([s.response_ids[0] for s in samples]), minlength=probs.numel()).double()
    assert 0.5 * (counts / n - probs).abs().sum() < 0.05
