"""Several reward functions, weighted and summed, called either as TRL calls them or as credo's group functions.

`reward.functions: [module:fn, ...]` with `reward.weights: [...]` is TRL's `reward_funcs` / `reward_weights`.
A function whose signature names `completions` is called as TRL's GRPOTrainer calls it, with keyword
arguments (one list entry per response of the group):

    prompts         the prompts as the data set holds them (a string, or a list of chat messages)
    completions     the decoded responses; [{"role": "assistant", "content": text}] for chat prompts
    completion_ids  the response token ids
    <column>        every other column of the data set (answer included), e.g. solution=[...]

Keywords the function does not take are left out unless it has `**kwargs`. Any other function is a
credo group function `fn(responses, problems) -> list[float]`. A TRL-style function may return None for
a sample it does not apply to; the weighted sum skips it (TRL's nansum) and its mean ignores it. A function
that raises fails the group's call, which the reward worker then retries sample by sample
(`credo.rewards.worker`): only the samples it cannot score are masked.
"""

from __future__ import annotations

import inspect
from typing import Callable

from credo.rewards.worker import ScoredGroup, import_reward_fn


def is_trl_style(fn: Callable) -> bool:
    """True when fn's signature names `completions` (TRL's reward-function convention)."""
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _accepted(fn: Callable) -> set[str] | None:
    """The keyword names fn takes, or None when it takes **kwargs (everything)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


TRL_INPUTS = ("prompts", "completions", "completion_ids")
"""The keywords every TRL-style call gets; any other keyword a function requires must be a data set column."""


def check_columns(fns: list[Callable], keys: list[str], problems: list, where: str) -> None:
    """Each TRL-style function's required keywords (no default) are among TRL's inputs and the task's columns, so
    a missing column is an error before any model loads, not a failed call after the first rollout.

    Args:
        fns: the reward functions; keys: their recipe keys (reward.functions[i]); problems: sample problems of the
            task (their `meta['columns']`); where: the task, for the message.
    """
    from credo.errors import ConfigError

    columns = sorted({k for p in problems for k in p.meta.get("columns", {})})
    for fn, key in zip(fns, keys):
        if not is_trl_style(fn):
            continue
        for name, p in inspect.signature(fn).parameters.items():
            required = p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            if required and name not in TRL_INPUTS and name not in columns:
                raise ConfigError(f"config key '{key}' needs the data set column '{name}', which {where} lacks "
                                  f"(columns: {', '.join(columns) or 'none'}; TRL's inputs: {', '.join(TRL_INPUTS)})")


def trl_kwargs(responses: list[str], problems: list, completion_ids: list[list[int]] | None) -> dict[str, list]:
    """The keyword arguments TRL passes a reward function for these responses (one entry per response)."""
    chat = [isinstance(p.prompt, list) for p in problems]
    kwargs: dict[str, list] = {
        "prompts": [p.prompt for p in problems],
        "completions": [[{"role": "assistant", "content": r}] if c else r for r, c in zip(responses, chat)],
        "completion_ids": list(completion_ids) if completion_ids is not None else [None] * len(responses),
    }
    columns: list[str] = []
    for p in problems:
        columns += [k for k in p.meta.get("columns", {}) if k not in columns]
    for k in columns:
        if k not in kwargs:
            kwargs[k] = [p.meta.get("columns", {}).get(k) for p in problems]
    return kwargs


class WeightedRewards:
    """The group reward function of `reward.functions`: `(responses, problems, completion_ids) -> ScoredGroup`.

    `names` (the functions' `__name__`) key the per-function means logged as `train/rewards/<name>`.
    """

    takes_completion_ids = True

    def __init__(self, fns: list[Callable], weights: list[float] | None = None):
        weights = [1.0] * len(fns) if not weights else [float(w) for w in weights]
        self.names = [getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(fns)]
        seen: dict[str, int] = {}
        for i, name in enumerate(self.names):  # two functions of one name would share a metric
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                self.names[i] = f"{name}_{seen[name]}"
        self.fns, self.weights = list(fns), dict(zip(self.names, weights))
        self._trl = [is_trl_style(f) for f in fns]
        self._accepts = [_accepted(f) if t else None for f, t in zip(fns, self._trl)]
        self.__name__ = "+".join(self.names)

    @classmethod
    def from_specs(cls, specs: list[str], weights: list[float]) -> "WeightedRewards":
        return cls([import_reward_fn(s, key=f"reward.functions[{i}]") for i, s in enumerate(specs)], weights)

    def __call__(self, responses: list[str], problems: list, completion_ids: list[list[int]] | None = None) -> ScoredGroup:
        raw = {}
        kwargs = None
        for name, fn, trl, accepts in zip(self.names, self.fns, self._trl, self._accepts):
            if trl:
                kwargs = kwargs or trl_kwargs(responses, problems, completion_ids)
                raw[name] = fn(**(kwargs if accepts is None else {k: v for k, v in kwargs.items() if k in accepts}))
            else:
                raw[name] = fn(responses, problems)
        return ScoredGroup(raw, self.weights)
