"""Soft prefixes on the vLLM backend (prompt embeddings): the engine's sampled log-probs against a naive forward.

The reference is written here: the prefix concatenated by hand before the prompt's and the response's token
embeddings, one sequence at a time, `log_softmax(logits / T)` at the response tokens. One engine, started once
(15-30 s on CPU), so the file is marked `vllm` like tests/distributed/test_vllm_parity.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from credo.config import TinyModelConfig  # noqa: E402
from credo.distributed.vllm_backend import VLLMBackend  # noqa: E402
from credo.models import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.vllm


def naive_log_probs(model, prefix, prompt, response, temperature):
    emb = model.get_input_embeddings()
    x = torch.cat([prefix, emb(torch.tensor(prompt + response))], 0)[None]
    with torch.no_grad():
        logits = model(inputs_embeds=x).logits[0].double() / temperature
    start = prefix.shape[0] + len(prompt) - 1
    rows = logits[start:start + len(response)].log_softmax(-1)
    return rows[torch.arange(len(response)), torch.tensor(response)]


def test_vllm_reads_the_prefix_as_the_trainer_does():
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(TinyModelConfig(tie_word_embeddings=False))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    backend = VLLMBackend(str(path), kv_cache_gib=0.25, enforce_eager=True, max_model_len=128,
                          input_embeddings=model.get_input_embeddings())
    try:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # far from uniform, so the prefix changes what is sampled
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        backend.sync_weights(model, 1)
        prompts = [[1] + torch.randint(4, 98, (n,), generator=g).tolist() for n in (3, 9, 5)]
        d = model.config.hidden_size
        scale = float(model.get_input_embeddings().weight.detach().std())
        prefix = torch.randn(len(prompts), 3, d, generator=g) * scale * 4
        out = backend.generate(prompts, max_new_tokens=8, temperature=0.7, seeds=[5, 6, 7], prefix_embeds=prefix)
        plain = backend.generate(prompts, max_new_tokens=8, temperature=0.7, seeds=[5, 6, 7])
        for s, pre in zip(out, prefix):
            ref = naive_log_probs(model, pre, s.prompt_ids, s.response_ids, 0.7)
            assert torch.allclose(torch.tensor(s.rollout_log_probs, dtype=torch.float64), ref, atol=1e-4)
        assert [s.response_ids for s in out] != [s.response_ids for s in plain]  # the prefix was read
        with pytest.raises(ValueError, match=r"prefix_embeds has shape \[3, 3, 7\], expected \[3, k, "):
            backend.generate(prompts, max_new_tokens=4, seeds=[1, 2, 3], prefix_embeds=torch.zeros(3, 3, 7))
    finally:
        backend.close()
