"""Soft prefixes through the rollout engine and every trainer forward (the core seam Reasoning Palette uses).

Each result is checked against a naive reference written differently: one sequence at a time, no padding, the
prefix concatenated by hand in front of the token embeddings, full-vocabulary log-softmax.
"""

from __future__ import annotations

import pytest
import torch

from credo.config import TinyModelConfig
from credo.distributed.rollout import HFBackend
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from credo.train.batch import Batch, pack
from credo.train.scoring import PolicyScorer, policy_forward


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
    path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                            intermediate_size=64, tie_word_embeddings=False))
    torch.manual_seed(0)
    model = load_causal_lm(str(path))
    with torch.no_grad():  # far from uniform, so the prefix changes what is sampled
        for p in model.parameters():
            p.mul_(6.0)
    yield model, load_tokenizer(str(path))
    mp.undo()


def naive_log_probs(model, prefix, prompt, response, temperature):
    """log p(response[t] | prefix, prompt, response[:t]) for one sequence: [len(response)]."""
    emb = model.get_input_embeddings()
    x = torch.cat([prefix, emb(torch.tensor(prompt + response))], 0)[None]
    with torch.no_grad():
        logits = model(inputs_embeds=x).logits[0].float() / temperature
    start = prefix.shape[0] + len(prompt) - 1
    rows = logits[start:start + len(response)].log_softmax(-1)
    return rows[torch.arange(len(response)), torch.tensor(response)]


def encode(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_sampler_and_scorer_see_the_same_prefix(tiny):
    """Mixed prompt lengths (left padding in generate, right padding in the scorer): the sampler's log-probs, the
    recompute's (hidden-state and logits paths) and the naive reference agree, and another prefix gives others."""
    model, tok = tiny
    prompts = encode(tok, ["1+2=", "33+4=", "7=", "12+34=", "5+5="]) * 2
    k, d, T = 3, model.config.hidden_size, 0.8
    prefix = torch.randn(len(prompts), k, d, generator=torch.Generator().manual_seed(1)) * 2.0
    samples = HFBackend(model, tok).generate(prompts, max_new_tokens=6, temperature=T, top_p=1.0,
                                             seeds=list(range(len(prompts))), prefix_embeds=prefix)
    assert len({tuple(s.response_ids) for s in samples}) > 1
    ids, attn, resp, rollout_lp = pack(samples, tok.pad_token_id)
    for hidden_path in (True, False):
        lp, _ = policy_forward(model, ids, attn, resp, temperature=T, chunk_size=7, with_entropy=False,
                               hidden_path=hidden_path, prefix_embeds=prefix)
        torch.testing.assert_close(lp[resp], rollout_lp[resp], atol=2e-4, rtol=0)
    for i, s in enumerate(samples):
        want = naive_log_probs(model, prefix[i], s.prompt_ids, s.response_ids, T)
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), want, atol=2e-4, rtol=0)
    other, _ = policy_forward(model, ids, attn, resp, temperature=T, chunk_size=7, with_entropy=False,
                              prefix_embeds=prefix.flip(0))
    assert (other[resp] - rollout_lp[resp]).abs().max() > 1e-2  # the rows are paired with their own sample's prefix


def test_greedy_generation_with_a_prefix_follows_the_naive_argmax(tiny):
    model, tok = tiny
    prompts = encode(tok, ["9+9=", "123+4="])
    prefix = torch.randn(2, 2, model.config.hidden_size, generator=torch.Generator().manual_seed(2)) * 2.0
    samples = HFBackend(model, tok).generate(prompts, max_new_tokens=5, temperature=1.0, top_p=1.0, seeds=None,
                                             prefix_embeds=prefix)
    emb = model.get_input_embeddings()
    for i, p in enumerate(prompts):
        out = []
        for _ in range(5):
            x = torch.cat([prefix[i], emb(torch.tensor(p + out))], 0)[None]
            with torch.no_grad():
                nxt = int(model(inputs_embeds=x).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
        assert samples[i].response_ids == out


def test_recompute_reference_and_update_forward_take_the_batch_prefix(tiny):
    """PolicyScorer: old and reference log-probs of the whole batch, and the update's forward of a micro-batch
    (rows 3, 1), each equal the naive reference under its own sample's prefix; with grad on the update path."""
    model, tok = tiny
    prompts = encode(tok, ["1+1=", "22+3=", "4=", "56+7="])
    prefix = torch.randn(4, 2, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    samples = HFBackend(model, tok).generate(prompts, max_new_tokens=4, temperature=1.0, top_p=1.0,
                                             seeds=[5, 6, 7, 8], prefix_embeds=prefix)
    batch = Batch(samples=samples, problems=[None] * 4, group_ids=torch.arange(4), prefix_embeds=prefix)
    batch.input_ids, batch.attention_mask, batch.response_mask, batch.rollout_log_probs = pack(samples, tok.pad_token_id)
    batch.loss_mask = batch.response_mask
    scorer = PolicyScorer(temperature=1.0, chunk_size=16, hidden_path=True, needs_old_log_probs=True, ref_model=model)
    scorer.recompute(model, batch)
    rows = torch.tensor([3, 1])
    lp, ent = scorer.update_forward(model, batch, rows)
    assert lp.requires_grad and ent.shape == lp.shape
    for j, i in enumerate(rows.tolist()):
        want = naive_log_probs(model, prefix[i], samples[i].prompt_ids, samples[i].response_ids, 1.0)
        torch.testing.assert_close(lp[j][batch.loss_mask[i]].detach(), want, atol=2e-4, rtol=0)
    for i, s in enumerate(samples):
        want = naive_log_probs(model, prefix[i], s.prompt_ids, s.response_ids, 1.0)
        torch.testing.assert_close(batch.old_log_probs[i][batch.loss_mask[i]], want, atol=2e-4, rtol=0)
        torch.testing.assert_close(batch.ref_log_probs[i][batch.loss_mask[i]], want, atol=2e-4, rtol=0)


def test_a_prefix_of_the_wrong_shape_is_named(tiny):
    model, tok = tiny
    prompts = encode(tok, ["1+1=", "2+2="])
    with pytest.raises(ValueError, match=r"prefix_embeds has shape \[2, 3, 5\], expected \[2, k, 32\]"):
        HFBackend(model, tok).generate(prompts, max_new_tokens=2, temperature=1.0, top_p=1.0, seeds=[1, 2],
                                       prefix_embeds=torch.zeros(2, 3, 5))


def test_the_latent_backend_passes_truncation_on_and_reports_its_engines_order(tiny):
    """palette with rollout.top_k / kept_set_replay: the default source asks its backend for top-k sampling with
    kept sets; through the latent backend those reach the engine (they raised a TypeError at step 1), and kept-set
    replay recomputes in the wrapped engine's truncation order, not the hf default."""
    from types import SimpleNamespace

    from credo.families.palette.source import LatentBackend
    from credo.families.palette.vae import PaletteVAE

    model, tok = tiny
    torch.manual_seed(0)
    vae = PaletteVAE(d_model=model.config.hidden_size, latent_dim=2, prefix_len=3, hidden=16)
    latent = LatentBackend(HFBackend(model, tok), vae, prior_scale=1.0, inject_frac=1.0)
    prompts, seeds = encode(tok, ["1+2=", "33+4=", "7=", "12+34="]) * 2, list(range(10, 18))
    kw = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, seeds=seeds)
    got = latent.generate(prompts, top_k=2, kept_set=True, **kw)
    want = HFBackend(model, tok).generate(prompts, prefix_embeds=latent.prefixes(latent.latents(seeds, len(prompts))),
                                          top_k=2, kept_set=True, **kw)
    assert [s.response_ids for s in got] == [s.response_ids for s in want]
    assert all(s.kept_thresholds is not None for s in got)
    assert [s.response_ids for s in latent.generate(prompts, **kw)] != [s.response_ids for s in got]
    assert latent.kept_set_order == "hf"
    assert LatentBackend(SimpleNamespace(kept_set_order="vllm"), vae, prior_scale=1.0,
                         inject_frac=0.0).kept_set_order == "vllm"
