"""Kept-set replay end to end on the hf backend: the sets the sampler records are the sets it drew from, and the
trainer's log-probs renormalised over them equal the sampler's (ratio pi_old / mu = 1); without replay the trainer's
full-softmax log-prob is below mu by exactly -log S, S the kept mass (docs/truncated_sampling.md)."""

import math
from types import SimpleNamespace

import pytest
import torch

from credo.algos import kept_mask
from credo.distributed.rollout import HFBackend
from credo.train.batch import pack, pack_kept_thresholds
from credo.train.scoring import kept_thresholds_of, policy_forward
from tests.fakes import sharp_tiny_policy

T = 0.7
RULES = [dict(top_k=3), dict(top_p=0.8), dict(min_p=0.2), dict(top_k=5, top_p=0.9, min_p=0.05)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 6.0)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "33+4=", "7=", "12+34="]] * 3
    return model, tok, prompts


def scored(model, tok, samples):
    """Packed tensors, the trainer's full-softmax and kept-set log-probs [B, T] and the scaled logits of the rows."""
    ids, attn, resp, mu = pack(samples, tok.pad_token_id)
    kept = pack_kept_thresholds(samples, ids.shape[1])
    kw = dict(temperature=T, chunk_size=16, with_entropy=False)
    with torch.no_grad():
        full, _ = policy_forward(model, ids, attn, resp, **kw)
        renorm, _ = policy_forward(model, ids, attn, resp, kept_threshold=kept, **kw)
        z = model(input_ids=ids, attention_mask=attn).logits[:, :-1][resp].float() / T
    return SimpleNamespace(ids=ids, attn=attn, resp=resp, mu=mu, kept=kept, full=full, renorm=renorm, z=z)


@pytest.mark.parametrize("rule, seeded", [(RULES[0], False), (RULES[1], True), (RULES[2], False), (RULES[3], True)],
                         ids=["top_k", "top_p-seeded", "min_p", "all-seeded"])
def test_replay_makes_the_ratio_one_and_without_it_the_gap_is_log_kept_mass(tiny, rule, seeded):
    model, tok, prompts = tiny
    backend = HFBackend(model, tok, per_sample_seeds=seeded)
    settings = {**dict(top_p=1.0), **rule}
    samples = backend.generate(prompts, max_new_tokens=6, temperature=T, seeds=list(range(len(prompts))),
                               kept_set=True, **settings)
    assert all(len(s.kept_thresholds) == len(s.response_ids) for s in samples)
    s = scored(model, tok, samples)
    mu, m = s.mu[s.resp], s.resp
    # replay: pi_old over the recorded set is the sampler's mu (KV-cached decode against one forward: float noise)
    torch.testing.assert_close(s.renorm[m], mu, atol=2e-5, rtol=0)
    # every sampled token lies in its recorded set, computed on the trainer's logits
    tau, labels = s.kept[m], s.ids[:, 1:][m]
    in_set = kept_mask(s.z, tau)
    assert in_set.gather(1, labels[:, None]).all()
    # without replay: log pi_full - log mu = log S, S = the full-softmax mass of the kept set
    log_s = torch.logsumexp(s.z.masked_fill(~in_set, -math.inf), -1) - torch.logsumexp(s.z, -1)
    torch.testing.assert_close(s.full[m] - mu, log_s, atol=2e-5, rtol=0)
    assert (log_s < -1e-3).float().mean() > 0.3  # the rules do cut mass on most tokens of this model


def test_recomputed_sets_match_the_recorded_ones(tiny):
    """What the scorer does for a sampler that reports no sets (vLLM): the same rule on pi_old's own logits."""
    model, tok, prompts = tiny
    rule = dict(top_k=4, top_p=0.85, min_p=0.05)
    samples = HFBackend(model, tok).generate(prompts, max_new_tokens=5, temperature=T, seeds=list(range(12)),
                                             kept_set=True, **rule)
    s = scored(model, tok, samples)
    batch = SimpleNamespace(input_ids=s.ids, attention_mask=s.attn, response_mask=s.resp, prefix_embeds=None,
                            kept_rule=dict(order="hf", **rule))
    recomputed = kept_thresholds_of(model, batch, temperature=T, chunk_size=8)
    assert torch.equal(kept_mask(s.z, recomputed[s.resp]), kept_mask(s.z, s.kept[s.resp]))
    assert (recomputed[~s.resp] == -math.inf).all()
    # the other scoring paths renormalise the same way: the logits path (ZeRO-3) and packed rows, with the entropy
    kw = dict(temperature=T, chunk_size=8, with_entropy=True, kept_threshold=s.kept)
    with torch.no_grad():
        chunked, ent = policy_forward(model, s.ids, s.attn, s.resp, **kw)
        for other in (dict(hidden_path=False), dict(packed=True)):
            lp, ent_other = policy_forward(model, s.ids, s.attn, s.resp, **kw, **other)
            torch.testing.assert_close(lp, chunked, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent_other, ent, atol=1e-5, rtol=0)
    p_kept = s.z.masked_fill(~kept_mask(s.z, s.kept[s.resp], s.ids[:, 1:][s.resp]), -math.inf).softmax(-1)
    torch.testing.assert_close(ent[s.resp], -(p_kept * p_kept.clamp(min=1e-30).log()).sum(-1), atol=1e-5, rtol=0)


def test_no_truncation_records_nothing_and_samples_as_before(tiny):
    """top_p = 1 and no top-k / min-p: kept_set=True changes no token and no log-prob, and records no set."""
    model, tok, prompts = tiny
    kw = dict(max_new_tokens=6, temperature=T, top_p=1.0, seeds=list(range(len(prompts))))
    for seeded in (False, True):
        backend = HFBackend(model, tok, per_sample_seeds=seeded)
        plain, replay = backend.generate(prompts, **kw), backend.generate(prompts, kept_set=True, **kw)
        assert [(a.response_ids, a.rollout_log_probs) for a in plain] == \
            [(b.response_ids, b.rollout_log_probs) for b in replay]
        assert all(b.kept_thresholds is None for b in replay)
    with pytest.raises(ValueError, match="top_k is -1"):
        HFBackend(model, tok).generate(prompts, top_k=-1, **kw)
