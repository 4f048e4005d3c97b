"""Shared by the Ray tests: one local Ray per test module, and a tiny policy folder the workers load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from credo.config import TinyModelConfig

ROOT = str(Path(__file__).resolve().parents[2])


def worker_env() -> dict:
    """The runtime env of the tests' Ray workers: the repo on their path (credo and tests import without an install)."""
    path = os.environ.get("PYTHONPATH", "")
    return {"env_vars": {"PYTHONPATH": ROOT + (os.pathsep + path if path else ""), "TOKENIZERS_PARALLELISM": "false"}}


def start_local_ray(num_cpus: int = 4):
    """A local Ray for one test module: logical CPUs (fractions of them per worker), no dashboard, quiet."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray's default 15 starves workers on a shared machine
    for attempt in range(6):  # Ray gives its raylet 30 s to register (fixed); a loaded shared machine can miss it
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=worker_env(),
                     logging_level="warning")
            return ray
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for it
            if "timed out during startup" not in str(e) or attempt == 5:
                raise
            ray.shutdown()
    return ray


def tiny_policy(folder: Path, *, tie_word_embeddings: bool = False, seed: int = 0):
    """A tiny Qwen2 saved to `folder` (with its tokenizer), its weights scaled x8 so samples vary;
    returns (path, model, tokenizer), the model loaded in this process from the same folder."""
    from credo.models import build_tiny_model, load_causal_lm, load_tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_CACHE", str(folder / "cache"))
        base = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                                intermediate_size=64, tie_word_embeddings=tie_word_embeddings,
                                                seed=seed))
    model = load_causal_lm(str(base))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    path = folder / "policy"
    model.save_pretrained(path)
    tok = load_tokenizer(str(base))
    tok.save_pretrained(path)
    return str(path), load_causal_lm(str(path)), load_tokenizer(str(path))


def encode(tok, texts: list[str]) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def token_ids(samples) -> list[list[int]]:
    return [list(s.response_ids) for s in samples]


def train_step(model, tok, lr: float = 1e-3) -> None:
    """One real Adam step of the policy on a next-token loss, so its weights change as in an RL update."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ids = torch.tensor(encode(tok, ["12+34=046", "98+76=174"]))
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    model.eval()
