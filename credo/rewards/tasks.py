"""`Problem`, as reward functions import it (`from credo.rewards.tasks import Problem`): part of the reward-function
contract, kept here for good. The tasks themselves moved to `credo.tasks`; their old names here still work for one
release, with a DeprecationWarning.
"""

from credo.tasks.problem import Problem

__all__ = ["Problem"]

_MOVED = ("ArithmeticTask", "ReasoningGymTask", "SplitSpaceTask", "TASKS", "check_rg_name", "make_task")


def __getattr__(name: str):
    if name in _MOVED:
        import warnings

        import credo.tasks

        warnings.warn(f"credo.rewards.tasks.{name} moved to credo.tasks.{name}; the old path will be removed in the "
                      "next release", DeprecationWarning, stacklevel=2)
        return getattr(credo.tasks, name)
    raise AttributeError(f"module 'credo.rewards.tasks' has no attribute '{name}'")
