"""Shared pieces of the asynchronous-training tests: a tiny policy, its tokenizer and the arithmetic task."""

from __future__ import annotations

import torch

from credo.config import TaskConfig, TinyModelConfig
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from credo.tasks import make_task
from credo.train.rollout import PromptRollout

SAMPLING = dict(prompts_per_step=3, group_size=4, max_new_tokens=4, temperature=1.0, top_p=1.0)


def tiny_policy(cache_dir) -> tuple[str, torch.nn.Module, object]:
    """A 1-layer tiny model (scaled so its samples vary), its folder and tokenizer; CREDO_CACHE must be set."""
    path = str(build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1,
                                                intermediate_size=64)))
    model = load_causal_lm(path)
    with torch.no_grad():  # far from uniform, so a weight change changes the samples
        for p in model.parameters():
            p.mul_(6.0)
    return path, model, load_tokenizer(path)


def arithmetic():
    return make_task(TaskConfig(name="arithmetic", train_size=500, eval_size=10,
                                kwargs={"max_operand": 9, "ops": "+", "fixed_width": True}))


def prompt_rollout(task, tok, backend, seed: int = 0, **over) -> PromptRollout:
    return PromptRollout(task, tok, backend, seed=seed, **{**SAMPLING, **over})


@torch.no_grad()
def perturb(model: torch.nn.Module, step: int) -> None:
    """A deterministic weight change standing in for an update (large enough to change what is sampled)."""
    gen = torch.Generator().manual_seed(1000 + step)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.5)


def same_samples(a, b) -> bool:
    """Token ids, sampler log-probs (bit for bit) and versions of two sample lists."""
    return [(s.prompt_ids, s.response_ids, s.rollout_log_probs, s.policy_version) for s in a] == \
        [(s.prompt_ids, s.response_ids, s.rollout_log_probs, s.policy_version) for s in b]
