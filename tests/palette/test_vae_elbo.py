"""Reasoning Palette's VAE: the ELBO against a naive reference written differently, and its gradients.

The reference loops over the pairs one at a time, with no padding: it builds each sequence's input embeddings by
hand (the decoded prefix, then the token embeddings), takes the full-vocabulary log-softmax of the model's logits,
sums the answer tokens' log-probs, and takes the KL from torch.distributions.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from credo.config import TinyModelConfig
from credo.families.palette.vae import PaletteVAE, elbo_loss, elbo_terms, kl_to_standard_normal, mean_pool
from credo.families.palette.warmup import demo_batch
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from credo.tasks import Problem
from credo.tasks.render import plain_prompt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
    path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                            intermediate_size=64, tie_word_embeddings=False))
    torch.manual_seed(0)
    model = load_causal_lm(str(path)).double()
    yield model, load_tokenizer(str(path))
    mp.undo()


PROBLEMS = [Problem("12+34=", "4+2+0=06,1+3+0=04>046"), Problem("5+5=", "10"), Problem("99+1=", "9+1=10>100"),
            Problem("7+8=", "15")]  # different lengths: padding and masks matter


def naive_elbo(model, vae, tok, problems, eps, kl_weight):
    """The negative beta-ELBO averaged over pairs, one pair at a time."""
    emb = model.get_input_embeddings()
    base = getattr(model, model.base_model_prefix)
    total = 0.0
    for i, p in enumerate(problems):
        q = tok(p.prompt, add_special_tokens=False)["input_ids"]
        a = tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([q + a])
        with torch.no_grad():
            pooled = base(input_ids=ids).last_hidden_state[0].mean(0)  # every token is real: a plain mean
        h = vae.encoder(pooled)
        mu, logvar = h[:vae.latent_dim], h[vae.latent_dim:]
        std = torch.exp(logvar / 2)
        z = mu + std * eps[i]
        prefix = vae.decoder(z) .mul(vae.embed_std).reshape(vae.prefix_len, -1)
        x = torch.cat([prefix.to(emb.weight.dtype), emb(ids[0])], 0)
        logp = torch.log_softmax(model(inputs_embeds=x[None]).logits[0].double(), -1)
        start = vae.prefix_len + len(q) - 1  # the position whose output predicts the first answer token
        recon = sum(logp[start + t, tok_id] for t, tok_id in enumerate(a))
        kl = kl_divergence(Normal(mu, std), Normal(torch.zeros_like(mu), torch.ones_like(std))).sum()
        total = total + (kl_weight * kl - recon)
    return total / len(problems)


def test_elbo_matches_the_naive_reference_in_value_and_gradient(tiny):
    model, tok = tiny
    torch.manual_seed(1)
    vae = PaletteVAE(32, latent_dim=3, prefix_len=2, hidden=16, embed_std=0.7).double()
    eps = torch.randn(len(PROBLEMS), 3, dtype=torch.float64)
    ids, attn, answer = demo_batch(tok, plain_prompt, PROBLEMS)
    terms = elbo_terms(model, vae, ids, attn, answer, eps, chunk_size=5)
    loss = elbo_loss(terms, kl_weight=0.3)
    got = torch.autograd.grad(loss, list(vae.parameters()) + list(model.parameters()))
    want_loss = naive_elbo(model, vae, tok, PROBLEMS, eps, kl_weight=0.3)
    want = torch.autograd.grad(want_loss, list(vae.parameters()) + list(model.parameters()))
    torch.testing.assert_close(loss, want_loss, atol=0, rtol=1e-6)  # fp64; the rotary tables are fp32 in both
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-7, rtol=1e-5)
    assert all(g.abs().sum() > 0 for g in got[:4])  # every VAE layer gets a gradient, through the LM


def test_kl_and_its_gradient_are_the_closed_form():
    torch.manual_seed(2)
    mu = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    logvar = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    kl = kl_to_standard_normal(mu, logvar)
    std = (logvar / 2).exp()
    want = kl_divergence(Normal(mu, std), Normal(torch.zeros_like(mu), torch.ones_like(std))).sum(-1)
    torch.testing.assert_close(kl, want)
    g_mu, g_logvar = torch.autograd.grad(kl.sum(), (mu, logvar))
    torch.testing.assert_close(g_mu, mu.detach())  # d/dmu 0.5 mu^2
    torch.testing.assert_close(g_logvar, 0.5 * (logvar.detach().exp() - 1))  # d/dlogvar 0.5 (e^lv - lv)
    assert torch.autograd.gradcheck(kl_to_standard_normal, (mu, logvar))


def test_mean_pool_ignores_padding():
    h = torch.arange(24, dtype=torch.float64).view(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(mean_pool(h, mask), torch.stack([h[0, :2].mean(0), h[1].mean(0)]))


def test_the_reparameterised_draw_carries_the_encoders_gradient(tiny):
    """d recon / d(mu, logvar) flows through z = mu + exp(logvar/2) eps: zero noise leaves logvar without one."""
    model, tok = tiny
    torch.manual_seed(3)
    vae = PaletteVAE(32, latent_dim=2, prefix_len=1, hidden=8).double()
    ids, attn, answer = demo_batch(tok, plain_prompt, PROBLEMS[:2])
    terms = elbo_terms(model, vae, ids, attn, answer, torch.zeros(2, 2, dtype=torch.float64))
    mu, logvar = terms["mu"], terms["logvar"]
    g_mu, g_lv = torch.autograd.grad(terms["recon"].sum(), (mu, logvar), retain_graph=True)
    assert g_mu.abs().sum() > 0 and torch.count_nonzero(g_lv) == 0
