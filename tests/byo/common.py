"""A user's own model and data, made in the test: a tiny Qwen2 with a trained byte-level BPE tokenizer and a
chat template, a JSONL data set, and TRL-style reward functions (tests.byo.rewards)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """A few KB of text: questions, answers and chat-like lines."""
    rng = random.Random(seed)
    words = ["what", "is", "the", "sum", "of", "and", "answer", "please", "add", "numbers", "user", "assistant",
             "system", "you", "are", "a", "helpful", "model", "think", "step"]
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(f"{' '.join(rng.choices(words, k=5))} {a}+{b}={a + b}")
    return lines


def build_bpe_tokenizer(*, pad: bool = False, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained here, Qwen2-style specials, eos = <|im_end|>, no pad unless asked."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>" if pad else None,
                                   additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model_dir(path: Path, *, pad: bool = False, seed: int = 0, chat_template: bool = True) -> Path:
    """Save a tiny Qwen2 + tokenizer with save_pretrained into `path`; returns it."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = build_bpe_tokenizer(pad=pad)
    if not chat_template:
        tok.chat_template = None
    config = Qwen2Config(vocab_size=(len(tok) + 63) // 64 * 64, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n: int, seed: int, *, chat: bool = False) -> list[dict]:
    """Addition questions with an answer column and an extra 'level' column."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        q = f"what is {a}+{b}"
        rows.append({"prompt": [{"role": "user", "content": q}] if chat else q, "answer": str(a + b), "level": i % 3})
    return rows
