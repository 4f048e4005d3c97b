"""Models and tokenizers with no hub access: a built-in tiny Qwen2/Llama factory and a checked loader.

The tiny tokenizer is character level (printable ASCII), built with the `tokenizers` library and wrapped in
`PreTrainedTokenizerFast`, so it saves and loads like any Hugging Face tokenizer (vLLM reads it too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import string
from dataclasses import asdict
from pathlib import Path

import torch

from credo.config import ConfigError, TinyModelConfig

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def cache_root() -> Path:
    """Project cache folder (ignored by git): $CREDO_CACHE or ./.cache/credo."""
    return Path(os.environ.get("CREDO_CACHE", Path.cwd() / ".cache" / "credo")).resolve()


def build_char_tokenizer():
    """A character-level fast tokenizer over printable ASCII with pad/bos/eos/unk specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Split into single characters; keep every character (spaces included) as its own token.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
"""`TinyModelConfig` fields read only by the qwen3_moe arch (left out of the other archs' cache keys)."""


def tiny_model_config(cfg: TinyModelConfig, vocab_size: int, tokenizer):
    """A transformers config for the tiny model (vocab padded to a multiple of 64). qwen3_moe: every block's MLP is a
    sparse block of `num_experts` experts, top-`num_experts_per_tok` routing with renormalised gate weights (as
    Qwen3-30B-A3B: norm_topk_prob), no auxiliary loss in the model's own forward."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3MoeConfig

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}[cfg.arch]
    padded_vocab = (vocab_size + 63) // 64 * 64
    moe = {}
    if cfg.arch == "qwen3_moe":
        if cfg.num_experts_per_tok > cfg.num_experts:
            raise ConfigError(f"config key 'model.tiny.num_experts_per_tok' = {cfg.num_experts_per_tok} is out of "
                              f"range: expected <= model.tiny.num_experts ({cfg.num_experts})")
        moe = dict(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[], head_dim=cfg.hidden_size // cfg.num_heads, output_router_logits=False)
    return cls(
        **moe, vocab_size=padded_vocab, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32", rms_norm_eps=1e-6, rope_theta=10000.0,
    )


def tiny_model_dir(cfg: TinyModelConfig) -> Path:
    """Where the tiny model of this config is (or will be) built; holds COMPLETE once built."""
    fields = asdict(cfg)
    if cfg.arch != "qwen3_moe":  # the expert fields do not shape the dense archs (their folders keep their names)
        fields = {k: v for k, v in fields.items() if k not in MOE_FIELDS}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"tiny-{cfg.arch}-{key}"


def build_tiny_model(cfg: TinyModelConfig) -> Path:
    """Build (or reuse) the tiny model + tokenizer as a local HF directory keyed by the config hash."""
    from transformers import AutoModelForCausalLM

    out = tiny_model_dir(cfg)
    if (out / "COMPLETE").exists():
        return out
    tokenizer = build_char_tokenizer()
    config = tiny_model_config(cfg, len(tokenizer), tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "COMPLETE").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; theirs is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(path: str, tiny: TinyModelConfig) -> str:
    """'tiny' -> the built tiny model's directory; otherwise the path (or hub id) itself."""
    if path == "tiny":
        return str(build_tiny_model(tiny))
    p = Path(path).expanduser()
    if p.exists():  # a folder here wins over a hub id of the same spelling ('org/name'), and is never sent to the hub
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.path '{path}' exists but has no config.json: expected a Hugging Face model directory")
        return str(p.resolve())
    parent = p.parent
    if path.startswith((".", "/", "~")) or os.sep in path.strip("/") and path.count("/") != 1 or (
            str(parent) not in ("", ".") and parent.is_dir()):
        # 'models/nope' next to a models/ folder is a missing folder, not the hub id of an org 'models'
        raise ConfigError(f"model.path '{path}' does not exist (expected 'tiny', a local Hugging Face model directory or a hub id)")
    return path  # a hub id; loading reports if there is no network


def model_context(path: str) -> int | None:
    """max_position_embeddings of the model folder (None when its config cannot be read here)."""
    from transformers import AutoConfig

    try:
        return getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    except (OSError, ValueError):
        return None


_PAD_WARNED: set[str] = set()


def _is_char_tokenizer(path: str) -> bool:
    """The folder holds the built-in character tokenizer (a WordLevel tokenizer.json)."""
    f = Path(path) / "tokenizer.json"
    if not f.is_file():
        return False
    try:
        return json.loads(f.read_text()).get("model", {}).get("type") == "WordLevel"
    except (OSError, ValueError):
        return False


def load_tokenizer(path: str):
    """Load a tokenizer and check it can pad and stop: it must have an EOS, and gets PAD = EOS if it lacks one."""
    from transformers import AutoTokenizer

    try:
        if _is_char_tokenizer(path):  # AutoTokenizer (transformers 5) rebuilds it as a byte-level BPE by the
            from transformers import PreTrainedTokenizerFast  # model type, which drops spaces and newlines

            tok = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path '{path}': could not load a tokenizer ({str(e).splitlines()[0]})") from None
    if tok.eos_token_id is None:
        raise ConfigError(f"tokenizer at '{path}' has no eos_token: expected one so responses can end")
    if tok.pad_token_id is None:  # as TRL does; padding is masked out, and pad == eos is handled where it matters
        if path not in _PAD_WARNED:
            _PAD_WARNED.add(path)
            logging.getLogger("credo").warning("tokenizer at '%s' has no pad_token: using its eos_token %r as pad",
                                               path, tok.eos_token)
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str = "float32"):
    """Load a causal LM and check its vocabulary against the tokenizer's. A local folder whose pickled weight file
    names code is refused first (`UnsafeFileError` naming the file; transformers would refuse it too, weights-only)."""
    from transformers import AutoModelForCausalLM

    from credo.safe_load import check_model_folder

    check_model_folder(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path '{path}': could not load a causal LM ({str(e).splitlines()[0]})") from None
    return model


def check_vocab(model, tokenizer, path: str) -> None:
    n_emb = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > n_emb:
        raise ConfigError(
            f"vocab mismatch at '{path}': tokenizer has {len(tokenizer)} tokens but the model's embedding has {n_emb} rows; "
            f"expected at most {n_emb} tokens (use the model's own tokenizer, or resize the embedding and save the model)"
        )
