"""The agent family's recipe section (`agent:`): how credo runs an agent through its gateway, and its checks.

The agent itself is the core key `rollout.agent` ('pkg.module:run_episode'); this section holds the settings of
running it: concurrency, the per-episode timeout, the failure budget, the per-call token cap, where the episodes'
task rows and the warm-up's demonstrations come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from credo.config import one_of, ranged
from credo.config.sections import RoleConfig
from credo.errors import ConfigError


@dataclass
class AgentConfig:
    max_concurrent: int = ranged(8, ge=1)
    """Episodes whose agents run at once (threads, or Ray tasks with placement: ray; each calls the gateway over HTTP)."""
    placement: str = one_of("thread", ("thread", "ray"))
    """Where each episode's agent runs: 'thread' (a thread of the trainer process) or 'ray' (a Ray task placed by
    cluster.agent.resources, default {CPU: 0.25}; needs cluster.engine: ray; docs/gateway.md "With Ray")."""
    timeout_s: float = ranged(600.0, gt=0)
    """An episode whose agent runs longer fails (counted; its episode closed, late calls refused with HTTP 409): a
    thread is abandoned, a Ray task cancelled (its worker process killed)."""
    max_failure_frac: float = ranged(0.5, ge=0, le=1)
    """Stop the run when more than this fraction of a step's episodes fail (the agent raised, hung or gave no reward)."""
    max_tokens: int = ranged(128, ge=1)
    """Cap on the tokens one chat-completions call samples (a request's max_tokens may only lower it)."""
    batch_window_ms: float = ranged(0.0, ge=0, note="0 = off")
    """0: each call is sampled on its own, one at a time (reproducible); > 0: calls of concurrent agents that arrive
    within this window are sampled in one generate call (faster; with the hf backend the tokens then depend on which
    calls share a batch, so a run is not reproducible run to run; credo/gateway/batching.py)."""
    model_name: str = "policy"
    """The model name agents pass (`model=`); a call naming another model is refused (HTTP 404)."""
    tasks: Optional[str] = None
    """'pkg.module:task_row': task_row(index, split) -> dict, the row of training ('train') or held-out ('eval') episode
    `index` given to the agent as `task`; null = the recipe task's problems ({'prompt', 'answer', **meta})."""
    demos: Optional[str] = None
    """'pkg.module:demonstration': demonstration(index) -> {'messages': [...], 'tools': [...] or None}, an expert
    conversation in OpenAI's format, rendered by the gateway's chat template for the warm-up; null = the recipe task's
    own prompt/answer warm-up."""
    eval_episodes: int = ranged(32, ge=1)
    """Held-out episodes (rows index 0.. of the 'eval' split) per evaluation; eval/agent_reward is their mean reward."""
    chat_template: Optional[str] = None
    """A Jinja chat-template file (a path, relative to the working directory) used instead of the tokenizer's own, as
    vLLM's `--chat-template`: the gateway renders every chat request with it and the warm-up its demonstrations;
    null = the tokenizer's template, or credo's ChatML + Hermes default when it has none (credo/gateway/chat.py)."""


AGENT_RESOURCES = {"CPU": 0.25}
"""An agent task's Ray request when cluster.agent.resources is empty: an agent mostly waits on HTTP, so four share a CPU."""


@dataclass
class AgentRoleConfig(RoleConfig):
    """`cluster.agent:`: where the agents' Ray tasks run (agent.placement: ray), one task per episode. How many run at
    once is agent.max_concurrent; the capacity check counts one task at least beside the actors."""

    workers: int = ranged(1, ge=1, le=1)
    """Not a pool size: agent.max_concurrent sets how many agent tasks run at once (kept at 1)."""
    max_restarts: int = ranged(0, ge=0, le=0)
    """Not used: an agent task whose worker process is lost fails its own episode (it is not run again; kept at 0)."""

    default_resources = AGENT_RESOURCES  # a class attribute, not a recipe key: `resources_of` falls back to it


AGENT_STAGE = "agent"


def check_agent(r) -> None:
    """rollout.agent and stages.rollout: agent go together, with the agent reward stage and no env: section."""
    agent, stage = r.rollout.agent, r.stages.rollout
    if stage == AGENT_STAGE and not agent:
        raise ConfigError("config key 'stages.rollout' = 'agent' needs rollout.agent: 'pkg.module:run_episode' "
                          "(the agent to run through the gateway)")
    if agent is not None and (not isinstance(agent, str) or ":" not in agent):
        raise ConfigError(f"config key 'rollout.agent' = {agent!r}: expected 'package.module:function'")
    if agent and stage not in ("default", AGENT_STAGE):
        raise ConfigError(f"config key 'rollout.agent' = '{agent}' is set but stages.rollout is '{stage}': expected "
                          "stages.rollout: agent (or default)")
    if agent and r.stages.reward not in ("default", AGENT_STAGE):
        raise ConfigError(f"config key 'rollout.agent' = '{agent}' needs stages.reward: agent (or default): the reward "
                          f"is what the agent returns, got stages.reward = '{r.stages.reward}'")
    if agent and getattr(r, "env", None) is not None and r.env.id:
        raise ConfigError(f"config key 'rollout.agent' = '{agent}' and env.id = '{r.env.id}': the agent plays its own "
                          "environment (through its task rows); expected env.id: null")
