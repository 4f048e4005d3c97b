"""Build-time parts of the Complementary RL family (`credo.family`): what `credo check` verifies before any
warm-up, the one-model mode's lesson warm-up of the actor, and the extractor hook (the second model: its warm-up,
its engine; or, with complementary.extractor: self, the bank hook)."""

from __future__ import annotations

import os

from credo.errors import ConfigError
from credo.family import FamilyParts


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
    if c.extractor == "self":
        path = "actor"  # no second model (config.check_one_model refuses any other extractor_path)
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
    if c.extractor == "self":
        from credo.families.complementary.hook import BankHook

        return [BankHook(parts.source, c)]
    return [make_hook(ctx, parts.source, c)]


LESSON_WARMUP_KEYS = ("extractor_sft_steps", "extractor_sft_lr", "extractor_sft_batch", "extractor_demo_noise")


def warmup(r, task, policy_path: str, *, log) -> tuple[str, str | None]:
    """complementary.extractor: self: the actor's lesson warm-up (the second model's warm-up, `extractor.warm_up`,
    run on the actor itself), from `policy_path` (credo's warm-up output). Its batches draw from the scripted
    (episode, lesson) pairs and, as many, the actor's own game demonstrations (the run's task, rendered as credo's
    warm-up renders them), so writing lessons is learned without unlearning the game (inferred: the paper's
    actor is a pretrained LLM that needs no such warm-up). Cached under $CREDO_CACHE/complementary/<key>.
    Nothing in the other modes, or with extractor_sft_steps: 0."""
    c = r.complementary
    if c.extractor != "self" or not c.extractor_sft_steps:
        return policy_path, None
    import hashlib
    import json
    import random
    import shutil
    from dataclasses import asdict
    from pathlib import Path

    import torch

    from credo.families.complementary.extractor import demo_pairs, warm_up
    from credo.families.multiturn.envs import make_env
    from credo.models import cache_root, check_vocab, load_causal_lm, load_tokenizer
    from credo.sft import data_digest, kernel_fingerprint, model_digest
    from credo.tasks.render import prompt_renderer

    folder = Path(policy_path)
    payload = {"model": model_digest(folder) if folder.is_dir() else {"path": policy_path}, "data": data_digest(r),
               "env": asdict(r.env), "section": {k: getattr(c, k) for k in LESSON_WARMUP_KEYS}, "seed": r.run.seed,
               "kernels": kernel_fingerprint(), "version": 1}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    out = cache_root() / "complementary" / key
    if (out / "COMPLETE").exists():
        log(f"complementary: reusing the cached lesson warm-up of the actor {out}")
        return str(out), key
    tok = load_tokenizer(policy_path)
    model = load_causal_lm(policy_path, r.model.dtype)
    check_vocab(model, tok, policy_path)
    n = max(256, c.extractor_sft_batch * 8)
    factory = lambda: make_env(r.env.id, **dict(r.env.kwargs))  # noqa: E731
    pairs = demo_pairs(factory, n, max_turns=r.env.max_turns, expert_noise=r.env.expert_noise,
                       demo_noise=c.extractor_demo_noise, seed=r.run.seed)
    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)
    rng = random.Random(r.run.seed + 29)
    games = [task.train(rng.randrange(len(task))) for _ in range(n)]
    pairs += [(render(p), p.answer) for p in games]
    with torch.random.fork_rng(devices=[]):  # the run's global RNG does not depend on whether the cache was warm
        torch.manual_seed(r.run.seed + 17)
        losses = warm_up(model, tok, pairs, steps=c.extractor_sft_steps, batch=c.extractor_sft_batch,
                         lr=c.extractor_sft_lr, seed=r.run.seed)
    log(f"complementary: lesson warm-up of the actor, {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "COMPLETE").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same warm-up first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out), key


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
    if not c.extractor_async:
        return ExtractorHook(source, engine, HFBackend(engine.module, ctx.tokenizer), ctx.tokenizer, c, seed=ctx.seed,
                             zero_stage=ctx.zero_stage, world=ctx.world)
    # beside the actor (beside.py): a tokenizer, an actor copy and samplers of its own, none of which draws from
    # the global RNG (the trainer's thread forks and reseeds it at every seeded sampling call)
    import copy

    from credo.distributed.rollout_copy import RolloutCopy
    from credo.families.complementary.beside import Beside

    tok = copy.deepcopy(ctx.tokenizer)
    actor = RolloutCopy(ctx.engine.module, dtype=None, fp8_weights=False)
    max_batch = r.rollout.hf_max_batch
    return ExtractorHook(source, engine, HFBackend(engine.module, tok, per_sample_seeds=True, max_batch=max_batch),
                         tok, c, seed=ctx.seed, zero_stage=ctx.zero_stage, world=ctx.world,
                         beside=(Beside(), actor, ctx.engine.module,
                                 HFBackend(actor.module, tok, per_sample_seeds=True, max_batch=max_batch)))


PARTS = FamilyParts(preflight=preflight, hooks=hooks, warmup=warmup)
