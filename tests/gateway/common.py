"""A tiny policy that really calls a tool: the built-in char-level Qwen2, trained for ~150 Adam steps (about a
second) to answer the first prompt of the scripted agent with one Hermes tool call, then served by a Gateway."""

from __future__ import annotations

import contextlib

import torch

from credo.config import TinyModelConfig

TOOLS = [{"type": "function", "function": {"name": "add"}}]
FIRST = [{"role": "user", "content": "2+3?"}]
TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
MODEL = "credo-tiny"


@contextlib.contextmanager
def one_thread():
    """One intra-op thread: on the shared 2-core machine two threads made each tiny step ~100x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def tool_calling_policy():
    """(model, tokenizer) of a tiny policy that answers FIRST (with TOOLS) by TOOL_CALL and EOS."""
    from transformers import AutoModelForCausalLM

    from credo.gateway.chat import check_messages, render
    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()  # the built-in tiny model's, in memory (build_tiny_model would also save both)
    config = tiny_model_config(TinyModelConfig(num_layers=2, hidden_size=64, num_heads=2, num_kv_heads=1,
                                               intermediate_size=128, tie_word_embeddings=False,
                                               max_position_embeddings=1024), len(tok), tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    prompt = tok(render(tok, check_messages(FIRST), TOOLS), add_special_tokens=False)["input_ids"]
    target = tok(TOOL_CALL + tok.eos_token, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(600):
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        if out.loss.item() < 0.003:
            break
    model.eval()
    return model, tok


def untrained_policy():
    """(model, tokenizer): the built-in tiny char-level Qwen2 at its random initialisation, in memory."""
    from transformers import AutoModelForCausalLM

    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    config = tiny_model_config(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=1, num_kv_heads=1,
                                               intermediate_size=64, max_position_embeddings=512), len(tok), tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), tok
