"""Build-time parts of the agent family (`credo.family`): the entry points' checks (before any warm-up), the task
(rows and demonstrations) and the held-out evaluator."""

from __future__ import annotations

import inspect

from credo.errors import ConfigError
from credo.family import FamilyParts, import_spec

AGENT_KEYWORDS = ("base_url", "api_key", "model", "task")


def entry_point(spec: str, key: str, keywords: tuple = (), positional: int = 0):
    """The callable `spec` names, imported; a ConfigError naming `key` when it does not import, is not callable, or
    cannot take the call credo makes (`positional` arguments, then `keywords`)."""
    fn = import_spec(spec, key)
    if not callable(fn):
        raise ConfigError(f"config key '{key}' = '{spec}' is a {type(fn).__name__}, expected a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call itself will tell
        return fn
    try:
        sig.bind(*range(positional), **{k: None for k in keywords})
    except TypeError as e:
        call = ", ".join([f"arg{i}" for i in range(positional)] + [f"{k}=" for k in keywords])
        raise ConfigError(f"config key '{key}' = '{spec}' cannot be called as {fn.__name__}({call}): {e}") from None
    return fn


def chat_template(path: str | None) -> str | None:
    """The text of `agent.chat_template` (None when unset); a ConfigError naming the key when the file cannot be read
    or is not a Jinja template (rendering is checked on the first demonstration when the task is built)."""
    if path is None:
        return None
    from pathlib import Path

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # what transformers compiles chat templates with

    where = f"config key 'agent.chat_template' = '{path}'"
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {Path(path).resolve()}: {e.strerror or e}") from None
    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"{where}: not a Jinja template: line {e.lineno}: {e.message}") from None
    return text


def check_names(r) -> None:
    """rollout.agent, agent.tasks and agent.demos import and take the calls credo makes; agent.chat_template reads
    and renders."""
    entry_point(r.rollout.agent, "rollout.agent", AGENT_KEYWORDS)
    chat_template(r.agent.chat_template)
    if r.agent.tasks:
        entry_point(r.agent.tasks, "agent.tasks", positional=2)
    if r.agent.demos:
        entry_point(r.agent.demos, "agent.demos", positional=1)


def preflight(r) -> list[str]:
    """agent.placement: ray: the agent role's request can be placed (this machine's resources for a Ray the run
    starts; checked again against the live cluster when the source starts its first agent task)."""
    if r.agent.placement != "ray" or r.cluster.engine != "ray":
        return []
    from credo.preflight import check_cluster_placement

    return check_cluster_placement(r, ("agent",))


def task(r):
    """AgentTask: rows from agent.tasks (or the recipe's task), demonstrations from agent.demos (or the recipe's task)."""
    from credo.families.agent.task import AgentTask
    from credo.models import load_tokenizer, resolve_model_path
    from credo.tasks import make_task

    rows = entry_point(r.agent.tasks, "agent.tasks", positional=2) if r.agent.tasks else None
    demos = entry_point(r.agent.demos, "agent.demos", positional=1) if r.agent.demos else None
    base = make_task(r.task) if rows is None or demos is None else None
    tokenizer = None
    if demos is not None:
        tokenizer = load_tokenizer(resolve_model_path(r.model.path, r.model.tiny))
        if getattr(tokenizer, "chat_template", None) and r.task.chat_template is not False:
            raise ConfigError(f"config key 'task.chat_template' = {r.task.chat_template!r} with agent.demos: the "
                              "demonstrations are rendered by the gateway's chat template already; expected "
                              "task.chat_template: false (so the warm-up does not wrap them a second time)")
        from credo.families.agent.task import demonstration_problem

        demonstration_problem(tokenizer, demos(0), f"config key 'agent.demos' = '{r.agent.demos}'",  # fails now
                              template=chat_template(r.agent.chat_template), turn_parts=r.sft.mask_observations)
    return AgentTask(r.agent, tokenizer, rows=rows, base=base, demos=demos, train_size=r.task.train_size,
                     template=chat_template(r.agent.chat_template), turn_parts=r.sft.mask_observations)


def evaluator(ctx, source, temperature: float):
    """`eval/agent_reward`: agent.eval_episodes held-out episodes through the gateway."""
    from credo.families.agent.source import AgentEvaluator

    return AgentEvaluator(source, ctx.section.eval_episodes, temperature=temperature, seed=ctx.seed)


PARTS = FamilyParts(check_names=check_names, preflight=preflight, task=task, evaluator=evaluator)
