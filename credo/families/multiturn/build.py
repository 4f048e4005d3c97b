"""Build-time parts of the multi-turn family (`credo.family`): the env's names and settings, what the run will
meet before its first step (the warm-up's expert, the first prompt against the token budget, the model's
context), the warm-up task and the evaluator."""

from __future__ import annotations

from credo.errors import ConfigError
from credo.family import FamilyParts


def check_names(r) -> None:
    """env.id is a built-in or a registered GEM id, and every env.kwargs key a setting it honours."""
    from credo.families.multiturn.envs import check_env_id, check_env_kwargs

    check_env_id(r.env.id)
    check_env_kwargs(r.env.id, dict(r.env.kwargs))


def preflight(r) -> list[str]:
    """The env role's placement with cluster.engine: ray (env actors), then `check_episodes`."""
    notes = []
    if r.cluster.engine == "ray" and r.cluster.env.workers:
        from credo.preflight import check_cluster_placement

        notes = check_cluster_placement(r, ("env",))
    return notes + check_episodes(r)


def check_episodes(r) -> list[str]:
    """What `credo run` would meet before its first step: a warm-up (or IPA resampling) needs the env's scripted
    expert; env.max_total_tokens must fit the model's context and leave room for a turn after the first prompt."""
    from credo.config import sft_enabled
    from credo.families.multiturn.envs import env_class, make_env

    e = r.env
    has_expert = hasattr(env_class(e.id), "expert_action")
    if sft_enabled(r) and r.sft.steps > 0 and not has_expert:
        raise ConfigError(f"config key 'sft.enabled' is on, but env '{e.id}' has no scripted expert to make warm-up "
                          "demonstrations (expert_action): expected sft.enabled: false")
    if e.init_resample_frac > 0 and not has_expert:
        raise ConfigError(f"config key 'env.init_resample_frac' = {e.init_resample_frac} needs an env with a scripted "
                          f"expert; '{e.id}' has none: expected env.init_resample_frac: 0")
    env = make_env(e.id, **dict(e.kwargs))  # first: its env.kwargs checks hold without a tokenizer
    found = _tokenizer_and_render(r)
    if found is None:
        return [f"env '{e.id}': first prompt length not checked (the model's tokenizer does not load here)"]
    tokenizer, prompt_text, _ = found
    from credo.families.multiturn.episodes import observation_text

    first = observation_text(*env.reset(seed=0))
    n = len(tokenizer(prompt_text(first), add_special_tokens=False)["input_ids"])
    if n + 1 > e.max_total_tokens:
        raise ConfigError(f"config key 'env.max_total_tokens' = {e.max_total_tokens} leaves no room for a turn: the "
                          f"first prompt of '{e.id}' (seed 0) is {n} tokens with this model's tokenizer; every episode "
                          f"would end before its first turn. Expected env.max_total_tokens >= "
                          f"{n + e.max_new_tokens_per_turn}")
    return []


def _tokenizer_and_render(r):
    """(tokenizer, first-prompt text of an observation, observation renderer) as the source will use them; None when
    the model's tokenizer does not load here. env.max_total_tokens is checked against the model's context."""
    from credo.families.multiturn.source import turn_format
    from credo.models import load_tokenizer, model_context, resolve_model_path
    from credo.tasks import Problem
    from credo.tasks.render import prompt_renderer

    base = resolve_model_path(r.model.path, r.model.tiny)
    limit = model_context(base)
    if limit is not None and r.env.max_total_tokens > limit:
        raise ConfigError(f"config key 'env.max_total_tokens' = {r.env.max_total_tokens} is more than the model's "
                          f"context of {limit} tokens (max_position_embeddings)")
    try:
        tokenizer = load_tokenizer(base)
    except (OSError, ValueError, ConfigError):  # not loadable here: loading the model reports it
        return None
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    prompt_text, observation = turn_format(tokenizer, render, r.env.observation_template)
    return tokenizer, lambda obs: render(Problem(prompt=prompt_text(obs), answer="")), observation


def task(r):
    """The env's expert episodes as the run's task (warm-up demonstrations); env.max_total_tokens must fit the base
    model's context (checked before the warm-up)."""
    from credo.families.multiturn.source import turn_format
    from credo.families.multiturn.task import EnvTask
    from credo.models import load_tokenizer, model_context, resolve_model_path
    from credo.tasks.render import prompt_renderer

    base = resolve_model_path(r.model.path, r.model.tiny)
    limit = model_context(base)
    if limit is not None and r.env.max_total_tokens > limit:
        raise ConfigError(f"config key 'env.max_total_tokens' = {r.env.max_total_tokens} is more than the model's "
                          f"context of {limit} tokens (max_position_embeddings)")
    try:
        tokenizer = load_tokenizer(base)
    except (OSError, ValueError):  # not loadable here: loading the model reports it
        return EnvTask(r.env, None, None, None)
    render = prompt_renderer(tokenizer, r.task.system_prompt, r.task.chat_template)
    return EnvTask(r.env, tokenizer, *turn_format(tokenizer, render, r.env.observation_template))


def evaluator(ctx, source, temperature: float):
    """`eval/return`: env.eval_episodes held-out episodes played by the multi-turn source."""
    from credo.families.multiturn.source import EnvEvaluator

    return EnvEvaluator(source, ctx.section.eval_episodes, temperature=temperature, seed=ctx.seed)


PARTS = FamilyParts(check_names=check_names, preflight=preflight, task=task, evaluator=evaluator)
