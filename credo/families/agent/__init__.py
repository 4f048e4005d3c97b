"""The agent family: an unmodified agent that speaks the OpenAI API, trained through credo's gateway (issue 54).

    config.py   the `agent:` section (concurrency, placement, timeout, failure budget, token cap, task rows,
                demonstrations) and the `cluster.agent` role (agent.placement: ray)
    source.py   AgentRollout (the `agent` rollout source: a Gateway over the run's rollout backend, the agent run
                G times per task row, the captured trajectories as the batch), AgentReward (the `agent` reward stage)
    task.py     AgentTask: the episodes' task rows and the warm-up's demonstrations rendered by the gateway's template
    build.py    build-time parts: the entry-point checks, the task, the held-out evaluator

Active when `rollout.agent` is set; it then makes `agent` the default rollout and reward stage. Credit is any
outcome estimator (GRPO on the episode rewards) or the multi-turn family's `turn_credit` stage (ReBN, IPA with
the model's turns as chunks). See docs/gateway.md.
"""

from credo.families.agent.config import AgentConfig, AgentRoleConfig, check_agent
from credo.capabilities import Refusal
from credo.family import Family, StageEntry


def _active(r) -> bool:
    return bool(getattr(r.rollout, "agent", None))


def _world() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", 1))


def _source_digest(spec: str) -> str | None:
    """sha256 of the file of the module `spec` names (without importing it); None when it cannot be found."""
    import hashlib
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.partition(":")[0])
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.has_location:
        return None
    with open(found.origin, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _warmup_digest(r) -> dict:
    # the warm-up trains on the demonstrations `agent.demos` makes (the recipe's task is in the key already): its
    # name and its module's source, so an edited demonstration function is a new warm-up
    if not r.agent.demos:
        return {}
    out = {"agent_demos": r.agent.demos, "agent_demos_source": _source_digest(r.agent.demos)}
    if r.agent.chat_template:  # the demonstrations' rendering (only when set: the default keys stay as they were)
        import hashlib
        from pathlib import Path

        try:
            out["agent_chat_template"] = hashlib.sha256(Path(r.agent.chat_template).read_bytes()).hexdigest()
        except OSError:  # unreadable: `credo check` names the key (build.chat_template) before any warm-up
            out["agent_chat_template"] = None
    return out


REFUSALS = (
    Refusal(("agent.placement", "cluster.engine"),
            lambda r, p: _active(r) and r.agent.placement == "ray" and r.cluster.engine != "ray",
            "agents run as Ray tasks on the run's Ray cluster, which cluster.engine: ray starts or joins (and stops); "
            "expected cluster.engine: ray, or agent.placement: thread (docs/gateway.md, With Ray)"),
    *(Refusal((key, "rollout.agent"), lambda r, p, key=key: _active(r) and getattr(r.rollout, key.split(".")[1]) > 0,
              "the gateway samples with temperature and top_p only (docs/gateway.md); expected top_k: 0, min_p: 0")
      for key in ("rollout.top_k", "rollout.min_p")),
    Refusal(("rollout.agent", "WORLD_SIZE"), lambda r, p: _active(r) and _world() > 1,
            "one gateway per trainer process is not built or tested yet; run the agent on one process"),
)


FAMILY = Family(
    name="agent",
    doc="agents that speak the OpenAI API, trained through credo's token-exact gateway (docs/gateway.md)",
    section="agent",
    config=AgentConfig,
    check=check_agent,
    stages={
        "rollout": {"agent": StageEntry("credo.families.agent.source:agent_source")},
        "reward": {"agent": StageEntry("credo.families.agent.source:agent_reward")},
    },
    active=_active,
    stage_defaults=lambda r: {"rollout": "agent", "reward": "agent"},
    warmup_digest=_warmup_digest,
    refusals=REFUSALS,
    build="credo.families.agent.build",
    roles={"agent": AgentRoleConfig},
)
