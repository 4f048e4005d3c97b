"""The run plan (credo.plan): resolved once, frozen, with declared capabilities; schedules are parts; family parts
are a checked object; the deprecated schedule keys map onto stages.schedule with a warning."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from credo.capabilities import BACKENDS, PROMPT_EMBEDS, RACE, ROUTING_CAPTURE
from credo.config import load_recipe
from credo.errors import ConfigError
from credo.family import FamilyParts, builtin_families
from credo.plan import resolve_plan

ROOT = Path(__file__).resolve().parents[2]
QUICK = "recipes/quickstart.yaml"


def test_the_plan_is_frozen_and_holds_what_build_needs():
    plan = resolve_plan(load_recipe(QUICK))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.backend = "vllm"
    with pytest.raises(TypeError):
        plan.stages["rollout"] = None
    assert plan.schedule.name == "sync" and plan.staleness == 0 and plan.backend == "hf" and plan.engine == "deepspeed"
    assert plan.stages["rollout"].resolved is None and plan.task_owner is None and plan.evaluator_owner is None


@pytest.mark.parametrize("old,new,staleness", [
    (["rollout.tail_batching={prompt_ratio: 1.5}"], ["stages.schedule=tail_batching",
                                                     "stages.schedule_kwargs={prompt_ratio: 1.5}"], 0),
    (["rollout.max_staleness=2"], ["stages.schedule=fixed_lag", "stages.schedule_kwargs={max_staleness: 2}"], 2),
    (["rollout.max_staleness=1", "rollout.async_mode=overlap", "rollout.async_workers=2"],
     ["stages.schedule=overlap", "stages.schedule_kwargs={max_staleness: 1, workers: 2}"], 1),
])
def test_the_old_schedule_keys_map_onto_the_schedule_with_a_warning(old, new, staleness):
    a, b = resolve_plan(load_recipe(QUICK, old)), resolve_plan(load_recipe(QUICK, new))
    assert a.schedule.name == b.schedule.name and a.schedule.settings == b.schedule.settings
    assert a.staleness == b.staleness == staleness
    assert any("deprecated" in n and f"stages.schedule: {b.schedule.name}" in n for n in a.notes)
    assert not any("deprecated" in n for n in b.notes)


def test_mixing_old_and_new_schedule_keys_names_both():
    with pytest.raises(ConfigError, match=r"^config keys 'stages.schedule' = 'fixed_lag' and 'rollout.max_staleness'"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=fixed_lag", "rollout.max_staleness=1"]))


def test_schedule_settings_are_strict():
    with pytest.raises(ConfigError, match=r"^unknown config key 'stages.schedule_kwargs.max_stale'; did you mean "
                                          r"'stages.schedule_kwargs.max_staleness'"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=fixed_lag", "stages.schedule_kwargs={max_stale: 1}"]))
    with pytest.raises(ConfigError, match=r"'stages.schedule_kwargs.max_staleness' = 0 is out of range"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=fixed_lag", "stages.schedule_kwargs={max_staleness: 0}"]))
    with pytest.raises(ConfigError, match=r"'stages.schedule_kwargs.max_staleness' = -1 is out of range"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=overlap", "stages.schedule_kwargs={max_staleness: -1}"]))
    with pytest.raises(ConfigError, match=r"'stages.schedule' = 'fixd_lag' is not a known schedule; did you mean "
                                          r"'fixed_lag'"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=fixd_lag"]))
    with pytest.raises(ConfigError, match=r"stages.schedule_kwargs.max_responses' = 3 is out of range"):
        resolve_plan(load_recipe(QUICK, ["stages.schedule=tail_batching", "stages.schedule_kwargs={max_responses: 3}",
                                         "rollout.group_size=8"]))


def test_async_keys_without_a_staleness_bound_are_said_to_be_synchronous():
    """Issue 57 A.4: rollout.async_mode=overlap without max_staleness used to be silently synchronous."""
    plan = resolve_plan(load_recipe(QUICK, ["rollout.async_mode=overlap"]))
    assert plan.schedule.name == "sync"
    assert any(n.startswith("warning: rollout.async_mode is set but rollout.max_staleness is 0") for n in plan.notes)


def test_declared_backend_capabilities_are_really_there():
    """Each capability a backend class declares is a method or keyword it has."""
    from credo.distributed.ray.rollout import RayRolloutBackend
    from credo.distributed.rollout import HFBackend
    from credo.distributed.vllm_async import AsyncVLLMBackend
    from credo.distributed.vllm_backend import VLLMBackend

    for cls, name in ((HFBackend, "hf"), (VLLMBackend, "vllm"), (RayRolloutBackend, "ray"),
                      (AsyncVLLMBackend, "vllm_async")):
        assert cls.provides == BACKENDS[name]
        assert (RACE in cls.provides) == hasattr(cls, "generate_race"), cls
        assert (PROMPT_EMBEDS in cls.provides) == ("prefix_embeds" in inspect.signature(cls.generate).parameters), cls
        assert (ROUTING_CAPTURE in cls.provides) == ("routing" in inspect.signature(cls.generate).parameters), cls
        assert hasattr(cls, "sync_weights")


def test_family_parts_are_a_checked_object():
    for fam in builtin_families():
        assert isinstance(fam.parts(), FamilyParts), fam.name
    with pytest.raises(TypeError, match="hook"):
        FamilyParts(hook=lambda ctx, parts: [])  # a misspelt part is an error, not silently ignored


def test_a_build_module_without_parts_is_an_error(tmp_path, monkeypatch):
    from credo.family import Family

    (tmp_path / "fam_without_parts.py").write_text("def hooks(ctx, parts):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match=r"fam_without_parts.PARTS is NoneType, expected a credo.family.FamilyParts"):
        Family(name="x", build="fam_without_parts").parts()


def test_two_families_claiming_the_task_is_an_error(monkeypatch):
    from credo import plan as plan_module

    fam = lambda name: plan_module.ActiveFamily(  # noqa: E731
        dataclasses.replace(builtin_families()[0], name=name), FamilyParts(task=lambda r: None), None)
    with pytest.raises(ConfigError, match="families 'a' and 'b' are both active and both make the run's task"):
        plan_module._owner((fam("a"), fam("b")), "task")


def test_config_preflight_registry_have_no_cycle():
    """credo.config imports no other credo module but credo.errors (the config -> preflight -> registry -> config
    circle is gone); the plan and preflight import config, never the other way."""
    code = ("import sys, credo.config\nprint(sorted(m for m in sys.modules if m.startswith('credo')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    loaded = set(eval(out.stdout))
    assert {m for m in loaded if not m.startswith("credo.config")} <= {"credo", "credo._moved", "credo.errors"}
    import ast

    for path in (ROOT / "credo" / "config").glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in mods if m.startswith(("credo.preflight", "credo.plan", "credo.train"))], path
