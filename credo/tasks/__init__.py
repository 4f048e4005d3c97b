"""Tasks: prompts, reference answers, a verifier, and disjoint train / held-out eval splits.

    problem.py        Problem (the record a reward function receives) and SplitSpaceTask
    registry.py       register_task / TASKS (a leaf: the concrete tasks import it, it imports none of them)
    arithmetic.py     `arithmetic`: integer + and -, exact-match verifier
    code.py           `code`: a one-line Python function from its description, hidden tests run in credo.sandbox
    skills.py         the testbed's `add_scratch`, `mul_scratch`, `sort`: worked answers, final result verified
    longtail.py       `longtail_add`: scratchpad addition with log-normal digit counts (long-tailed responses)
    reasoning_gym.py  `rg:<name>`: any reasoning-gym dataset
    data.py           `file` / `hf:<name>`: your own prompts and columns (no verifier: reward.functions score them)
    skill_tags.py     the skill vocabulary every generator tags its problems with (Problem.meta['skills'])
    render.py         prompt rendering (chat template, system prompt), shared by warm-up, rollout and eval

A family adds tasks of its own through its table (e.g. the judges' `judge_arithmetic`); `make_task` finds them.
"""

from __future__ import annotations

from credo.errors import ConfigError
from credo.tasks import arithmetic as _arithmetic  # noqa: F401  (registers 'arithmetic')
from credo.tasks import code as _code  # noqa: F401  (registers 'code')
from credo.tasks import longtail as _longtail  # noqa: F401  (registers 'longtail_add')
from credo.tasks import skills as _skills  # noqa: F401  (registers 'add_scratch', 'mul_scratch', 'sub_scratch', 'sort')
from credo.tasks.arithmetic import ArithmeticTask
from credo.tasks.problem import Problem, SplitSpaceTask
from credo.tasks.reasoning_gym import ReasoningGymTask, check_rg_name
from credo.tasks.registry import TASKS, register_task

__all__ = ["ArithmeticTask", "Problem", "ReasoningGymTask", "SplitSpaceTask", "TASKS", "check_rg_name",
           "make_task", "register_task", "task_names"]


def _families(families):
    if families is not None:
        return families
    from credo.family import builtin_families

    return builtin_families()


def task_names(families=None) -> list[str]:
    """Every registered task name, the families' included."""
    return sorted(set(TASKS) | {n for f in _families(families) for n in f.tasks})


def task_factory(name: str, families=None):
    """The factory of the task `name` (registered, or a family's), or None."""
    if name in TASKS:
        return TASKS[name]
    from credo.family import import_spec, task_factory as family_task

    spec = family_task(tuple(_families(families)), name)
    return None if spec is None else import_spec(spec, "task.name")


def make_task(cfg, families=None):
    """Build the task a recipe's `task:` section names: a registered or family task, `rg:<name>` (reasoning-gym),
    or `file` / `hf:<name>` (your own data, `credo.tasks.data`)."""
    kwargs = dict(cfg.kwargs)
    if cfg.name == "file" or cfg.name.startswith("hf:"):
        from credo.tasks.data import make_file_task

        return make_file_task(cfg.name, cfg)
    if cfg.name.startswith("rg:"):
        return ReasoningGymTask(cfg.name[3:], cfg.train_size, cfg.eval_size, cfg.seed, **kwargs)
    factory = task_factory(cfg.name, families)
    if factory is None:
        raise ConfigError(f"config key 'task.name' = '{cfg.name}' is not a known task (known: "
                          f"{', '.join(task_names(families))}, rg:<dataset>, file, hf:<name>)")
    _check_kinds(factory, kwargs)
    try:
        return factory(cfg.train_size, cfg.eval_size, cfg.seed, **kwargs)
    except TypeError as e:
        raise ConfigError(f"task.kwargs for '{cfg.name}': {e}") from None


def _check_kinds(factory, kwargs: dict) -> None:
    """Each task.kwargs value of the kind of its keyword's default ('maybe' for fixed_width: bool is no bool)."""
    import inspect

    from credo.config.fields import kind_mismatch

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read
        return
    for k, v in kwargs.items():
        wrong = kind_mismatch(f"task.kwargs.{k}", v, params[k].default) if k in params else ""
        if wrong:
            raise ConfigError(wrong)
