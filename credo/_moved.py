"""Import paths that moved in round 3 ("a family is a folder") and round 4 (rollout schedules are parts): they keep
working for one release, with a DeprecationWarning naming the new path. Nothing in credo imports an old path; this table is their only trace.

    MODULES      old module -> new module (a proxy module forwards every attribute to the new one)
    ATTRIBUTES   (old module, name) -> new module: a name that left a module which itself stayed
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MODULES = {
    "credo.train.critic": "credo.families.critic.stage",
    "credo.distributed.value_model": "credo.families.critic.value_model",
    "credo.train.multiturn": "credo.families.multiturn.source",
    "credo.train.turn_credit": "credo.families.multiturn.turn_credit",
    "credo.train.resample": "credo.families.multiturn.resample",
    "credo.envs": "credo.families.multiturn.envs",
    "credo.envs.task": "credo.families.multiturn.task",
    "credo.envs.guess": "credo.families.multiturn.envs.guess",
    "credo.envs.mastermind": "credo.families.multiturn.envs.mastermind",
    "credo.train.mipu": "credo.families.mipu.gate",
    "credo.train.judge_reward": "credo.families.judges.reward",
    "credo.train.ce_rm": "credo.families.judges.ce_rm",
    "credo.train.rm_nlhf": "credo.families.judges.rm_nlhf",
    "credo.rewards.judge": "credo.families.judges.parse",
    "credo.rewards.judge_prompts": "credo.families.judges.prompts",
    "credo.rewards.judge_tasks": "credo.families.judges.tasks",
    "credo.rewards.critique_similarity": "credo.families.judges.critique_similarity",
    "credo.rewards.best_of_n": "credo.families.judges.best_of_n",
    "credo.rewards.pgenrm": "credo.families.judges.pgenrm.judge",
    "credo.rewards.pgenrm_task": "credo.families.judges.pgenrm.task",
    "credo.rewards.pgenrm_scaling": "credo.families.judges.pgenrm.scaling",
    "credo.train.attention_probe": "credo.families.attention.probe",
    "credo.rewards.skills": "credo.tasks.skills",
    "credo.rewards.data": "credo.tasks.data",
    "credo.rewards.chat": "credo.tasks.render",
    # round 4: rollout schedules are parts (credo/schedules/), not core modules
    "credo.train.tail_batching": "credo.schedules.tail_batching",
    "credo.train.fixed_lag": "credo.schedules.fixed_lag",
    "credo.train.overlap": "credo.schedules.overlap",
}

ATTRIBUTES = {
    ("credo.config", "CriticConfig"): "credo.families.critic.config",
    ("credo.config", "MipuConfig"): "credo.families.mipu.config",
    ("credo.config", "EnvConfig"): "credo.families.multiturn.config",
    ("credo.config", "JudgeConfig"): "credo.families.judges.config",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path will be removed in the next release", DeprecationWarning,
                  stacklevel=3)


def moved_attribute(module: str, name: str):
    """For a module's `__getattr__`: the moved name from its new module (with a warning), else AttributeError."""
    new = ATTRIBUTES.get((module, name))
    if new is None:
        raise AttributeError(f"module '{module}' has no attribute '{name}'")
    _warn(f"{module}.{name}", f"{new}.{name}")
    return getattr(importlib.import_module(new), name)


class _Forward(types.ModuleType):
    """The old module: every attribute read (and `from old import x`) is the new module's."""

    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str):
        return getattr(object.__getattribute__(self, "_target"), name)

    def __dir__(self):
        return dir(object.__getattribute__(self, "_target"))


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path (after the regular finders have not) and loads a forwarding module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MODULES:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname == "credo.envs")
        return None

    def create_module(self, spec):
        new = MODULES[spec.name]
        _warn(spec.name, new)
        return _Forward(spec.name, importlib.import_module(new))

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())  # before the path finder: an old name never loads a file twice
