"""The stage registry (credo.train.registry): registering, resolving names and import specs, and the recipe
checks of `credo check`, with every error naming the recipe key."""

from __future__ import annotations

import pytest

from credo.config import ConfigError, StagesConfig
from credo.train import registry
from credo.train.registry import DEFAULT, KINDS, StageContext, register_stage, resolve

NOT_CALLABLE = 3


def check_stages(stages_config):
    """The run plan's resolution of a recipe's `stages:` section (the one place names are resolved)."""
    from credo.config import load_recipe
    from credo.plan import resolve_plan

    r = load_recipe(None, ["run.name=t"])
    r.stages = stages_config
    return resolve_plan(r)


def factory(ctx, scale: float = 1.0, *, mode="a"):
    return ("built", ctx, scale, mode)


def open_factory(ctx, **kwargs):
    return kwargs


def bare_factory(ctx):
    return ctx


@pytest.fixture
def empty_registry(monkeypatch):
    """A registry of no stages registered in code, so a test registers only its own (families' stages are found
    only through the family table a caller passes)."""
    monkeypatch.setattr(registry, "STAGES", {kind: {} for kind in KINDS})
    return registry.STAGES


def test_the_kinds_and_the_default_name():
    assert KINDS == ("rollout", "reward", "advantage", "probe")
    assert DEFAULT == "default"
    assert set(registry.STAGES) == set(KINDS)


def test_register_stage_adds_the_factory_unchanged_and_refuses_a_second_of_one_name(empty_registry):
    assert register_stage("reward", "mine")(factory) is factory
    assert empty_registry["reward"] == {"mine": factory} and empty_registry["rollout"] == {}
    assert resolve("reward", "mine", "stages.reward").factory is factory
    with pytest.raises(ValueError, match=r"^reward stage 'mine' is already registered$"):
        register_stage("reward", "mine")(open_factory)
    assert empty_registry["reward"]["mine"] is factory
    register_stage("probe", "mine")(open_factory)  # one name may serve two kinds
    assert empty_registry["probe"] == {"mine": open_factory}


def test_register_stage_names_the_known_kinds():
    with pytest.raises(ValueError, match=r"^unknown stage kind 'critic' \(known: rollout, reward, advantage, probe\)$"):
        register_stage("critic", "x")


def test_stage_context_reads_run_settings_from_its_recipe_and_is_frozen():
    from dataclasses import FrozenInstanceError

    from tests.fakes import recipe_with

    a = StageContext(rank=1, world=2)
    assert (a.rank, a.world, a.seed) == (1, 2, 0)  # the default recipe's run.seed
    for name in ("tokenizer", "task", "backend", "engine", "render", "default", "section", "policy_path", "ref_model",
                 "scorer", "source", "cluster"):
        assert getattr(a, name) is None, name
    r = recipe_with(**{"run": {"seed": 7, "eval_samples": 3, "eval_temperature": 1.0}, "model": {"dtype": "bfloat16"},
                     "rollout": {"group_size": 3, "top_k": 5, "max_new_tokens": 9},
                     "reward": {"timeout_s": 2.5}, "algo": {"advantage_kwargs": {"gamma": 0.9}}})
    b = StageContext(recipe=r)
    assert (b.seed, b.dtype, b.eval_samples, b.task_config) == (7, "bfloat16", 3, r.task)
    assert b.rollout == dict(prompts_per_step=r.rollout.prompts_per_step, group_size=3, max_new_tokens=9,
                             temperature=r.rollout.temperature, top_p=r.rollout.top_p, top_k=5)
    assert b.reward_isolation == dict(timeout_s=2.5, workers=r.reward.workers,
                                      max_failure_frac=r.reward.max_failure_frac)
    assert b.advantage_kwargs == {"gamma": 0.9} and b.zero_stage == r.optim.zero_stage
    b.rollout["group_size"] = 99  # a stage that edits what it was handed changes nothing the next one reads
    b.advantage_kwargs["gamma"] = 0.0
    assert b.rollout["group_size"] == 3 and b.advantage_kwargs == {"gamma": 0.9}
    with pytest.raises(FrozenInstanceError):
        b.seed = 3
    with pytest.raises(FrozenInstanceError):
        b.tokenizer = "another"


def test_resolve_default_is_the_builders_built_in():
    assert resolve("rollout", "default", "stages.rollout") is None
    assert resolve("probe", "default", "stages.probes[0]") is None


def test_resolve_an_import_spec():
    got = resolve("rollout", "tests.spine.test_stage_registry:factory", "stages.rollout")
    assert got.factory is factory and got.settings is None and got.family is None
    with pytest.raises(ConfigError, match=r"^config key 'stages.reward' = 'tests.no_such_mod:f': cannot import "
                                          r"module 'tests.no_such_mod' \(No module named 'tests.no_such_mod'\)$"):
        resolve("reward", "tests.no_such_mod:f", "stages.reward")
    for attr in ("nothing", "NOT_CALLABLE"):
        with pytest.raises(ConfigError, match=rf"^config key 'stages.advantage' = 'tests.spine.test_stage_registry:"
                                              rf"{attr}': module 'tests.spine.test_stage_registry' has no callable "
                                              rf"'{attr}'$"):
            resolve("advantage", f"tests.spine.test_stage_registry:{attr}", "stages.advantage")


def test_family_stages_resolve_through_the_table_with_their_settings_and_family():
    from credo.families.attention.config import AttentionCreditSettings
    from credo.families.attention.probe import make_attention_credit_probe
    from credo.families.multiturn.source import env_reward
    from credo.family import builtin_families

    fams = builtin_families()
    got = resolve("probe", "attention_credit", "stages.probes[0]", fams)
    assert got.factory is make_attention_credit_probe and got.settings is AttentionCreditSettings
    assert got.family.name == "attention"
    env = resolve("reward", "env", "stages.reward", fams)
    assert env.factory is env_reward and env.settings is None and env.family.section == "env"
    with pytest.raises(ConfigError, match=r"'stages.reward' = 'env' is not a known reward stage"):
        resolve("reward", "env", "stages.reward")  # without the table, no family stage


def test_an_unknown_name_suggests_the_closest_and_lists_the_known(empty_registry):
    from credo.family import Family, StageEntry

    fams = (Family(name="agents", stages={"rollout": {"multiturn": StageEntry("credo.families.multiturn.source:x")}}),)
    register_stage("rollout", "prompts")(factory)
    register_stage("rollout", "agent")(factory)
    with pytest.raises(ConfigError, match=r"^config key 'stages.rollout' = 'multiturm' is not a known rollout stage; "
                                          r"did you mean 'multiturn'\? \(known: agent, multiturn, prompts; or give "
                                          r"'package.module:factory'\)$"):
        resolve("rollout", "multiturm", "stages.rollout", fams)
    with pytest.raises(ConfigError, match=r"^config key 'k' = 'zzzzzz' is not a known rollout stage \(known: agent, "):
        resolve("rollout", "zzzzzz", "k", fams)
    with pytest.raises(ConfigError, match=r"^config key 'stages.probes\[1\]' = 'x' is not a known probe stage "
                                          r"\(known: none; or give 'package.module:factory'\)$"):
        resolve("probe", "x", "stages.probes[1]", fams)


def stages(**kw) -> StagesConfig:
    s = StagesConfig()
    for k, v in kw.items():
        setattr(s, k, v)
    return s


SPEC = "tests.spine.test_stage_registry:factory"


def test_check_stages_accepts_defaults_and_known_keyword_arguments():
    check_stages(stages())
    check_stages(stages(rollout=SPEC, rollout_kwargs={"scale": 2.0, "mode": "b"},
                        reward="tests.spine.test_stage_registry:open_factory", reward_kwargs={"anything": 1},
                        advantage="tests.spine.test_stage_registry:bare_factory",
                        probes=[SPEC], probe_kwargs={SPEC: {"scale": 1.0}}))


@pytest.mark.parametrize("kind", ["rollout", "reward", "advantage"])
def test_check_stages_refuses_settings_for_a_default_stage(kind):
    with pytest.raises(ConfigError, match=rf"^config key 'stages.{kind}_kwargs' is set but stages.{kind} is 'default', "
                                          rf"whose settings live in their own sections; name the stage they are for$"):
        check_stages(stages(**{f"{kind}_kwargs": {"x": 1}}))


@pytest.mark.parametrize("kind", ["rollout", "reward", "advantage"])
def test_check_stages_names_an_unknown_keyword_of_the_factory(kind):
    with pytest.raises(ConfigError, match=rf"^unknown config key 'stages.{kind}_kwargs.scal'; did you mean "
                                          rf"'stages.{kind}_kwargs.scale'\? \(valid: mode, scale\)$"):
        check_stages(stages(**{kind: SPEC, f"{kind}_kwargs": {"scal": 2}}))
    with pytest.raises(ConfigError, match=rf"^unknown config key 'stages.{kind}_kwargs.zzz' \(valid: mode, scale\)$"):
        check_stages(stages(**{kind: SPEC, f"{kind}_kwargs": {"scale": 1, "zzz": 2}}))
    with pytest.raises(ConfigError, match=rf"^unknown config key 'stages.{kind}_kwargs.a' \(valid: none\)$"):
        check_stages(stages(**{kind: "tests.spine.test_stage_registry:bare_factory", f"{kind}_kwargs": {"a": 1}}))


@pytest.mark.parametrize("kind", ["rollout", "reward", "advantage"])
def test_check_stages_resolves_each_kind_under_its_key(kind):
    with pytest.raises(ConfigError, match=rf"^config key 'stages.{kind}' = 'nosuchstage' is not a known {kind} stage"):
        check_stages(stages(**{kind: "nosuchstage"}))


def test_check_stages_checks_the_probes():
    with pytest.raises(ConfigError, match=r"^config key 'stages.probes\[1\]' = 3: expected a name or "
                                          r"'package.module:factory'$"):
        check_stages(stages(probes=[SPEC, 3]))
    with pytest.raises(ConfigError, match=r"^config key 'stages.probes\[1\]': there is no default probe; name one$"):
        check_stages(stages(probes=[SPEC, "default"]))
    with pytest.raises(ConfigError, match=r"^config key 'stages.probes\[0\]' = 'nosuch' is not a known probe stage"):
        check_stages(stages(probes=["nosuch"]))
    with pytest.raises(ConfigError, match=r"^config key 'stages.probe_kwargs.other' names no entry of stages.probes "
                                          r"\(\['tests.spine.test_stage_registry:factory'\]\)$"):
        check_stages(stages(probes=[SPEC], probe_kwargs={"other": {}}))


def test_a_suggestion_needs_half_the_name_to_match(empty_registry):
    register_stage("reward", "abxy")(factory)  # 'abcd' vs 'abxy': similarity 2 * 2 / 8 = 0.5, the cutoff
    with pytest.raises(ConfigError, match=r"= 'abcd' is not a known reward stage; did you mean 'abxy'\? "):
        resolve("reward", "abcd", "stages.reward")
    with pytest.raises(ConfigError, match=r"= 'azzz' is not a known reward stage \(known: abxy;"):  # 0.25: no hint
        resolve("reward", "azzz", "stages.reward")
