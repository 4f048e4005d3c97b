"""`rollout.agent` as a recipe key: `credo check` imports the entry point and checks it takes credo's call, naming
the key, before any warm-up; the agent family's refusals name both keys; recipes/gateway_gem.yaml plans."""

from __future__ import annotations

import pytest

from credo.config import load_recipe
from credo.errors import ConfigError

RECIPE = "recipes/gateway_gem.yaml"
EXAMPLE = "credo.gateway.examples.openai_guess"
NOT_CALLABLE = 3


def no_task_keyword(*, base_url, api_key, model):
    return 0.0


def plan(overrides=()):
    from credo.plan import resolve_plan

    return resolve_plan(load_recipe(RECIPE, list(overrides)))


def test_the_recipe_plans_with_the_agent_source_reward_and_turn_credit():
    p = plan()
    assert (p.stages["rollout"].name, p.stages["reward"].name, p.stages["advantage"].name) == ("agent", "agent",
                                                                                               "turn_credit")
    assert p.stages["rollout"].defaulted and [a.family.name for a in p.active] == ["agent"]
    assert p.task_owner.family.name == "agent" and p.evaluator_owner.family.name == "agent"


@pytest.mark.parametrize("spec,message", [
    ("tests.gateway.nowhere:run_episode", "config key 'rollout.agent' = 'tests.gateway.nowhere:run_episode': cannot "
                                          "import module 'tests.gateway.nowhere'"),
    (f"{EXAMPLE}:run_episod", f"config key 'rollout.agent' = '{EXAMPLE}:run_episod': module '{EXAMPLE}' has no "
                              "attribute 'run_episod'"),
    ("tests.gateway.test_agent_recipe:NOT_CALLABLE", "is a int, expected a function"),
    ("tests.gateway.test_agent_recipe:no_task_keyword", "cannot be called as no_task_keyword(base_url=, api_key=, "
                                                        "model=, task=)"),
    ("run_episode", "config key 'rollout.agent' = 'run_episode': expected 'package.module:function'"),
])
def test_credo_check_refuses_an_agent_entry_point_that_cannot_be_called_naming_the_key(spec, message, monkeypatch):
    from credo.train import build

    called = []
    monkeypatch.setattr(build, "run_task", lambda plan: called.append(1))  # the task (and any warm-up) comes after
    with pytest.raises(ConfigError) as e:
        build.check_run(load_recipe(RECIPE, [f"rollout.agent={spec}"]))
    assert message in str(e.value) and "rollout.agent" in str(e.value) and not called


@pytest.mark.parametrize("overrides,message", [
    (["agent.tasks=tests.gateway.test_agent_recipe:no_task_keyword"], "config key 'agent.tasks'"),
    (["agent.demos=tests.gateway.test_agent_recipe:NOT_CALLABLE"], "config key 'agent.demos'"),
    (["rollout.agent=null", "stages.rollout=agent"], "config key 'stages.rollout' = 'agent' needs rollout.agent"),
    # the warm-up's mask is not what is wrong here: the missing agent is named, not sft.mask_observations
    (["rollout.agent=null", "stages.rollout=agent", "sft.mask_observations=true"],
     "config key 'stages.rollout' = 'agent' needs rollout.agent"),
    (["stages.reward=env"], "needs stages.reward: agent"),
])
def test_the_agent_sections_entry_points_and_stages_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(overrides)


@pytest.mark.parametrize("overrides,keys", [
    (["stages.schedule=tail_batching"], ("stages.schedule", "stages.rollout' = 'agent")),
    (["stages.schedule=fixed_lag"], ("stages.schedule", "stages.rollout' = 'agent")),
    (["rollout.top_k=20"], ("rollout.top_k", "rollout.agent")),
    (["agent.placement=ray"], ("agent.placement", "cluster.engine")),
])
def test_combinations_the_agent_source_cannot_run_are_refused_naming_both_keys(overrides, keys):
    with pytest.raises(ConfigError) as e:
        plan(overrides)
    msg = str(e.value)
    assert msg.startswith("config keys ") and all(k in msg for k in keys), msg


def test_the_ray_engine_plans_with_agents_in_threads_or_on_ray_and_counts_the_agent_tasks():
    """cluster.engine: ray is no longer refused: the gateway fronts the Ray rollout pool; agent.placement: ray puts the
    agent role in the capacity check (one task at least, {CPU: 0.25} by default) and not the reward pool (the agent
    family's reward stage is not the function pool)."""
    from credo.distributed.ray.config import check_capacity, local_nodes, run_roles

    ray = ["cluster.engine=ray", "cluster.num_cpus=2"]
    assert plan(ray).stages["rollout"].name == "agent"
    assert run_roles(load_recipe(RECIPE, ray)) == ("rollout",)
    r = load_recipe(RECIPE, [*ray, "agent.placement=ray"])
    assert plan([*ray, "agent.placement=ray"]).stages["rollout"].name == "agent"
    assert run_roles(r) == ("rollout", "agent")
    assert check_capacity(r.cluster, local_nodes(r.cluster), run_roles(r)) == []  # 1 + 0.25 CPUs of 2
    full = load_recipe(RECIPE, [*ray, "agent.placement=ray", "cluster.rollout.resources={CPU: 2}"])
    with pytest.raises(ConfigError, match=r"'cluster.rollout.workers' = 1: .*\{CPU: 2.25\} in all .*agent 1 x "
                                          r"\{CPU: 0.25\} \(one task at least\)"):
        check_capacity(full.cluster, local_nodes(full.cluster), run_roles(full))
    label = load_recipe(RECIPE, [*ray, "agent.placement=ray", "cluster.agent.resources={agent_node: 1}"])
    with pytest.raises(ConfigError, match=r"config key 'cluster.agent.resources' = \{agent_node: 1\}: .*ask for less"):
        check_capacity(label.cluster, local_nodes(label.cluster), run_roles(label))
    with pytest.raises(ConfigError, match=r"'cluster.agent.workers' = 2 is out of range"):
        load_recipe(RECIPE, [*ray, "cluster.agent.workers=2"])


def test_without_rollout_agent_the_family_is_off_and_the_quickstart_plan_is_unchanged():
    from credo.plan import resolve_plan

    r = load_recipe("recipes/quickstart.yaml")
    assert r.rollout.agent is None
    p = resolve_plan(r)
    assert "agent" not in [a.family.name for a in p.active] and p.stages["rollout"].name == "default"
    assert p.stages["reward"].name == "default"


def test_the_agent_reward_stage_needs_no_task_verifier_at_build():
    """It passed `credo check` and failed after the warm-up: the builder asked the task for a verifier whenever the
    recipe said stages.reward: default, though the agent family had made `agent` the default."""
    from credo.train.build import default_reward_fn

    assert default_reward_fn(plan(), object()) is None
