"""Build-time parts of the Complementary RL family (`credo.family`): what `credo check` verifies before any
warm-up, and the extractor hook (the second model: its warm-up, its engine)."""

from __future__ import annotations

import os

from credo.errors import ConfigError


def preflight(r) -> list[str]:
    """The extractor's env has scripted lessons for its warm-up, its weights exist, and the run is one process."""
    from credo.families.complementary.extractor import check_extractor_env
    from credo.families.multiturn.envs import make_env

    c = r.complementary
    if c.extractor == "none":
        return []
    check_extractor_env(make_env(r.env.id, **dict(r.env.kwargs)), c)
    notes = []
    path = c.extractor_path
    if path not in ("actor", "tiny") and not os.path.isdir(path):
        hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
        if not hub_id:
            raise ConfigError(f"config key 'complementary.extractor_path' = '{path}' is not a folder: expected "
                              "'actor', 'tiny', a model folder or a hub id")
        notes.append(f"complementary.extractor_path '{path}': not checked (offline)")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise ConfigError(f"config key 'complementary.extractor' = '{c.extractor}': the extractor runs in one process "
                          "only; launch without torchrun (or complementary.extractor: none)")
    return notes


def hooks(ctx, parts) -> list:
    """The extractor hook (none with complementary.extractor: none)."""
    c = ctx.section
    if c.extractor == "none":
        return []
    return [make_hook(ctx, parts.source, c)]


def make_hook(ctx, source, c):
    import torch

    from credo.distributed.engine import build_engine
    from credo.distributed.rollout import HFBackend
    from credo.families.complementary.extractor import check_extractor_env, demo_pairs, warm_up
    from credo.families.complementary.hook import ExtractorHook
    from credo.models import check_vocab, load_causal_lm, resolve_model_path

    r = ctx.recipe
    if ctx.world > 1:
        raise ConfigError("config key 'complementary.extractor': the extractor runs in one process only")
    path = ctx.policy_path if c.extractor_path == "actor" else resolve_model_path(c.extractor_path, r.model.tiny)
    model = load_causal_lm(path, ctx.dtype)
    check_vocab(model, ctx.tokenizer, path)
    env = source.env_factory()
    check_extractor_env(env, c)
    if c.extractor_sft_steps:
        pairs = demo_pairs(source.env_factory, max(256, c.extractor_sft_batch * 8), max_turns=r.env.max_turns,
                           expert_noise=r.env.expert_noise, demo_noise=c.extractor_demo_noise, seed=ctx.seed)
        with torch.random.fork_rng(devices=[]):  # the warm-up leaves the run's global RNG as it was
            torch.manual_seed(ctx.seed + 17)
            warm_up(model, ctx.tokenizer, pairs, steps=c.extractor_sft_steps, batch=c.extractor_sft_batch,
                    lr=c.extractor_sft_lr, seed=ctx.seed)
    n = c.extract_per_step * c.candidates
    engine = build_engine(model, lr=c.extractor_lr, betas=(0.9, 0.999), weight_decay=c.extractor_weight_decay,
                          grad_clip=c.extractor_grad_clip, zero_stage=ctx.zero_stage, warmup_steps=0, micro_batch=n,
                          grad_accum=1, bf16=ctx.dtype == "bfloat16")
    return ExtractorHook(source, engine, HFBackend(engine.module, ctx.tokenizer), ctx.tokenizer, c, seed=ctx.seed,
                         zero_stage=ctx.zero_stage, world=ctx.world)
