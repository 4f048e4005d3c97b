"""The warm-up's opt-in options for steering (palette.free_bits, palette.encoder_input) against references written
differently, their config errors, and the defaults leaving the warm-up as it was (its cache key, its loss)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from credo.config import TinyModelConfig, load_recipe
from credo.errors import ConfigError
from credo.families.palette.vae import (PaletteVAE, elbo_loss, elbo_terms, encoder_input, free_bits_kl, load_vae,
                                        save_vae)
from credo.families.palette.warmup import WARMUP_KEYS, demo_batch, warmup_key
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from credo.sft import data_digest
from credo.tasks import Problem
from credo.tasks.render import plain_prompt
from credo.train.build import check_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "recipes", "palette.yaml")


def naive_free_bits(mu, logvar, floor):
    """sum over dimensions of max(floor, the batch mean of that dimension's KL), one dimension at a time, the KL
    from torch.distributions."""
    total = 0.0
    for j in range(mu.shape[1]):
        kl_j = kl_divergence(Normal(mu[:, j], torch.exp(0.5 * logvar[:, j])),
                             Normal(torch.zeros_like(mu[:, j]), torch.ones_like(mu[:, j]))).mean()
        total = total + (kl_j if kl_j > floor else torch.full_like(kl_j, floor))
    return total


def test_free_bits_kl_matches_a_naive_reference_in_value_and_gradient():
    torch.manual_seed(0)
    # dimension 0 far from the prior (above any floor here), dimension 2 at the prior (under it), 1 in between
    mu = torch.tensor([[1.5, 0.3, 0.0], [-1.0, 0.2, 0.01], [2.0, -0.4, 0.0], [0.5, 0.1, -0.02]], dtype=torch.float64)
    logvar = torch.tensor([[-1.0, -0.2, 0.0], [-0.5, 0.1, 0.01], [-2.0, 0.0, 0.0], [0.3, -0.1, 0.0]],
                          dtype=torch.float64)
    for floor in (0.0, 0.05, 0.2, 5.0):
        a, b = mu.clone().requires_grad_(), logvar.clone().requires_grad_()
        got = free_bits_kl(a, b, floor)
        g_mu, g_lv = torch.autograd.grad(got, (a, b))
        a2, b2 = mu.clone().requires_grad_(), logvar.clone().requires_grad_()
        want = naive_free_bits(a2, b2, floor)
        w_mu, w_lv = torch.autograd.grad(want, (a2, b2)) if want.requires_grad else (torch.zeros_like(mu),) * 2
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_mu, w_mu, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_lv, w_lv, rtol=1e-12, atol=1e-12)
    # the floor 0.2 sits between the dimensions' KLs: the one under it gets no gradient, the others theirs
    a, b = mu.clone().requires_grad_(), logvar.clone().requires_grad_()
    g_mu, _ = torch.autograd.grad(free_bits_kl(a, b, 0.2), (a, b))
    assert g_mu[:, 2].abs().sum() == 0 and g_mu[:, 0].abs().sum() > 0 and g_mu[:, 1].abs().sum() == 0
    assert float(naive_free_bits(mu, logvar, 0.2)) > 0.2 * 2  # the floor counts


def test_elbo_loss_with_free_bits_is_the_floor_and_without_is_the_plain_beta_elbo():
    torch.manual_seed(1)
    mu, logvar, recon = torch.randn(5, 4) * 0.3, torch.randn(5, 4) * 0.1, -torch.rand(5) * 10
    terms = {"mu": mu, "logvar": logvar, "recon": recon,
             "kl": kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(0.0, 1.0)).sum(-1)}
    torch.testing.assert_close(elbo_loss(terms, 0.3), (0.3 * terms["kl"] - recon).mean())
    torch.testing.assert_close(elbo_loss(terms, 0.3, free_bits=0.0), (0.3 * terms["kl"] - recon).mean())
    torch.testing.assert_close(elbo_loss(terms, 0.3, free_bits=10.0), 0.3 * 4 * 10.0 - recon.mean())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
    path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                            intermediate_size=64, tie_word_embeddings=False))
    torch.manual_seed(0)
    yield load_causal_lm(str(path)).double(), load_tokenizer(str(path))
    mp.undo()


PROBLEMS = [Problem("12+34=", "4+2+0=06,1+3+0=04>046"), Problem("5+5=", "10"), Problem("99+1=", "9+1=10>100")]


def test_answer_pooling_is_the_mean_over_the_answer_tokens(tiny):
    model, tok = tiny
    ids, attn, answer = demo_batch(tok, plain_prompt, PROBLEMS)  # right-padded rows of different lengths
    got = encoder_input(model, ids, attn, answer, "answer")
    pair = encoder_input(model, ids, attn, answer, "pair")
    base = getattr(model, model.base_model_prefix)
    for i, p in enumerate(PROBLEMS):  # one unpadded row at a time, the answer's positions counted by hand
        q = tok(p.prompt, add_special_tokens=False)["input_ids"]
        a = tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            h = base(input_ids=torch.tensor([q + a])).last_hidden_state[0]
        want = sum(h[t] for t in range(len(q), len(q) + len(a))) / len(a)
        torch.testing.assert_close(got[i], want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(pair[i], h.mean(0), rtol=1e-10, atol=1e-10)
        assert not torch.allclose(got[i], pair[i])
    with pytest.raises(ValueError, match="'question'"):
        encoder_input(model, ids, attn, answer, "question")


def test_elbo_terms_read_the_answer_pooling_and_the_vae_keeps_its_input(tiny, tmp_path):
    model, tok = tiny
    torch.manual_seed(2)
    vae = PaletteVAE(32, latent_dim=3, prefix_len=2, hidden=16, encoder_input="answer").double()
    ids, attn, answer = demo_batch(tok, plain_prompt, PROBLEMS)
    terms = elbo_terms(model, vae, ids, attn, answer, torch.zeros(3, 3, dtype=torch.float64), pool="answer")
    mu, _ = vae.encode(encoder_input(model, ids, attn, answer, "answer"))
    torch.testing.assert_close(terms["mu"], mu)
    save_vae(vae, tmp_path / "v.pt")
    assert load_vae(tmp_path / "v.pt").encoder_input == "answer"
    plain = PaletteVAE(32, latent_dim=3, prefix_len=2, hidden=16)
    save_vae(plain, tmp_path / "p.pt")
    saved = torch.load(tmp_path / "p.pt", weights_only=True)["config"]
    assert "encoder_input" not in saved and load_vae(tmp_path / "p.pt").encoder_input == "pair"


@pytest.mark.parametrize("overrides, message", [
    (["palette.free_bits=-0.1"], r"config key 'palette.free_bits' = -0.1 is out of range: expected >= 0"),
    (["palette.encoder_input=question"], r"config key 'palette.encoder_input' = 'question'.*pair or answer"),
    (["palette.free_bit=0.1"], "did you mean 'palette.free_bits'"),
])
def test_bad_steering_options_are_errors_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run(load_recipe(RECIPE, overrides))


def test_the_defaults_leave_the_warm_up_key_as_it_was(tmp_path):
    r = load_recipe(RECIPE)
    p = asdict(r.palette)
    old = {"model": {"hub_id": "x"}, "data": data_digest(r), "palette": {k: p[k] for k in WARMUP_KEYS}, "version": 1}
    assert warmup_key(r, "x") == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    keys = {warmup_key(load_recipe(RECIPE, o), "x") for o in
            ([], ["palette.free_bits=0.1"], ["palette.encoder_input=answer"], ["palette.eval_z=null"])}
    assert len(keys) == 3  # each option changes the warm-up; eval_z (an RL-time key) does not


def test_the_steer_recipe_is_the_palette_recipe_with_a_longer_stage_2():
    base, steer = asdict(load_recipe(RECIPE)), asdict(load_recipe(os.path.join(REPO, "recipes", "palette_steer.yaml")))
    assert steer["palette"].pop("sft_steps") == 800 and base["palette"].pop("sft_steps") == 100
    assert steer["run"].pop("name") == "palette_steer" and base["run"].pop("name") == "palette"
    assert steer == base
    check_run(load_recipe(os.path.join(REPO, "recipes", "palette_steer.yaml")))
