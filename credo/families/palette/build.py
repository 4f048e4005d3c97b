"""Build-time parts of the palette family (`credo.family`): the prefix-length check at `credo check`, the palette
warm-up after credo's SFT and the within-group diversity hook. (What the rollout engine must provide, prompt
embeddings, is declared on the palette source's StageEntry.)"""

from __future__ import annotations

from credo.errors import ConfigError
from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """With palette.enabled: the prefix + the longest prompt + rollout.max_new_tokens fit the model's context."""
    if not r.palette.enabled:
        return []
    from credo.family import families_of
    from credo.models import load_tokenizer, model_context, resolve_model_path
    from credo.tasks import make_task
    from credo.tasks.render import encode_prompts, prompt_renderer

    base = resolve_model_path(r.model.path, r.model.tiny)
    limit = model_context(base)
    if limit is None:
        return ["palette.prefix_len: not checked against the context (the model's config does not load here)"]
    k, new = r.palette.prefix_len, r.rollout.max_new_tokens
    if k + 1 + new > limit:  # even a one-token prompt does not fit
        raise _too_long(k, 1, "a one-token prompt", new, limit)
    try:
        tokenizer = load_tokenizer(base)
    except (OSError, ValueError, ConfigError):
        return ["palette.prefix_len: checked against a one-token prompt only (the tokenizer does not load here)"]
    task = make_task(r.task, families_of(r))
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    problems = [(f"eval problem {i}", p) for i, p in enumerate(task.eval_problems()[:1000])]
    problems += [(f"train problem {i}", task.train(i)) for i in range(min(len(task), 2000))]
    lengths = [len(ids) for ids in encode_prompts(tokenizer, render, [p for _, p in problems])]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if k + lengths[longest] + new > limit:
        raise _too_long(k, lengths[longest], problems[longest][0], new, limit)
    return []


def _too_long(k: int, prompt: int, where: str, new: int, limit: int) -> ConfigError:
    room = limit - prompt - new
    fix = f"expected palette.prefix_len <= {room}" if room >= 1 else "shorten prompts or rollout.max_new_tokens"
    return ConfigError(f"config key 'palette.prefix_len' = {k} does not fit: the prefix ({k}) + {where} ({prompt} "
                       f"tokens) + rollout.max_new_tokens ({new}) = {k + prompt + new} > the model's context of "
                       f"{limit} tokens (max_position_embeddings); {fix}")


def warmup(r, task, policy_path: str, *, log) -> tuple[str, str | None]:
    """The palette warm-up (credo.families.palette.warmup) from `policy_path` (credo's warm-up output, or the model):
    (the warmed-up policy folder with the VAE beside it, its cache key). Nothing without palette.enabled."""
    if not r.palette.enabled:
        return policy_path, None
    from credo.families.palette.warmup import run_warmup

    return run_warmup(r, policy_path, task, log=log)


def warmup_plan(r, task, policy_path: str | None, base_path: str) -> dict | None:
    """`credo check`'s view of the palette warm-up (credo.warmup_estimate): its steps (VAE, then SFT through the
    prefix), its work, and whether it is cached; `policy_path` is credo's cached warm-up (None: not cached yet, so
    neither is this one, whose key hashes that folder)."""
    if not r.palette.enabled:
        return None
    from credo.families.palette.warmup import warmup_key
    from credo.models import cache_root
    from credo.warmup_estimate import flops_per_step, model_shape, padded_tokens, token_counter

    p = r.palette
    steps = p.vae_steps + p.sft_steps
    tokens = padded_tokens(task, token_counter(base_path), p.batch_size) + p.prefix_len
    folder = cache_root() / "palette" / warmup_key(r, policy_path) if policy_path else None
    return {"name": "palette", "steps": steps, "batch": p.batch_size,
            "flops": steps * flops_per_step(model_shape(r, base_path), p.batch_size, tokens),
            "cached": folder is not None and (folder / "COMPLETE").exists(), "folder": str(folder)}


def hooks(ctx, parts) -> list:
    """The within-group diversity metrics (palette/*) of every step."""
    from credo.families.palette.source import DiversityHook

    return [DiversityHook(ctx.tokenizer, getattr(ctx.task, "strategy", None), getattr(ctx.task, "strategies", ()))]


PARTS = FamilyParts(preflight=preflight, warmup=warmup, hooks=hooks, warmup_plan=warmup_plan)
