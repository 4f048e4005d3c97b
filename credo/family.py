"""Families: one table entry per algorithm family, read by the recipe loader, `credo check` and the builder.

A family (critics, multi-turn agents, MIPU, judges, attention credit, or one of your own) is a folder that
declares, in one `Family` value:

    section, config        its recipe section: the key (`critic`) and a dataclass of fields with their ranges
    check(recipe)          its load-time checks: values that only make sense together, naming the key at fault
    stages                 its stages by kind (rollout, reward, advantage, probe): name -> StageEntry, each a
                           factory 'module:attr' (imported on first use) and the dataclass of its
                           stages.<kind>_kwargs, checked at `credo check` before any warm-up
    tasks                  task names it adds (task.name), 'module:attr' of factory(train_size, eval_size, seed, **kw)
    active(recipe)         whether its section changes this run beyond the stages the recipe names
    stage_defaults(recipe) stages that replace 'default' when it is active (the critic stage for advantages)
    warmup_digest(recipe)  what the warm-up's cache key must add (the env, for expert demonstrations)
    holdout(recipe)        training problems held out of the default rollout source (MIPU's validation prompts)
    refusals               combinations with its section that cannot run, as `credo.capabilities.Refusal` rows
    commands               its CLI verbs: verb -> 'module:attr' of add_parser(subparsers), which adds the verb's
                           subparser with its handler set (`credo bon`, `credo palette`); built-in families only
                           (the CLI parses its arguments before any recipe names a family)
    listing                'module:attr' of listing(names) -> text: its part of `credo list` (the env ids)
    roles                  its Ray roles: role -> the dataclass of its `cluster.<role>:` section (judge, env),
                           added under `cluster:` by the recipe loader after the core's rollout and reward roles
    build                  the module of its build-time parts, imported only when active: it declares
                           `PARTS = FamilyParts(...)`, checked when loaded (an unknown part is an error), with any of
                              check_names(recipe)                 names its section uses (env ids)
                              preflight(recipe) -> notes          targets its section points at (model folders)
                              task(recipe) -> task or None        the run's task, when the family makes it
                              evaluator(ctx, source, temperature)  the held-out evaluation, with a `metric`
                                                                   (and a dict `extra_metrics`, logged beside it)
                              hooks(ctx, parts) -> [StepHook]     called around every train step
                              warmup(recipe, task, policy_path, log=) -> (policy_path, key)
                                                                  its own warm-up after credo's (cached by it)

The core (`credo.config`, `credo.train`, `credo.trainer`) names no family: it reads this table. The built-in
families are listed in `credo/families/__init__.py`; a recipe adds its own with `families: ['pkg.mod:attr']`.
This module imports nothing heavy, so loading a recipe stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from credo.errors import ConfigError

KINDS = ("rollout", "reward", "advantage", "probe")
"""The kinds of stage a recipe's `stages:` section selects."""


@dataclass(frozen=True)
class StageEntry:
    """A family's stage: where its factory lives, what settings it takes and, for a rollout source, its capabilities."""

    factory: str
    """'module:attr' of `factory(ctx, settings)` (or `factory(ctx, **kwargs)` when `settings` is None)."""
    settings: type | None = None
    """Dataclass of the stage's `stages.<kind>_kwargs`; None: the stage takes no settings."""
    provides: frozenset = frozenset()
    """What the stage provides to a schedule (a rollout source: `batch_state`, `prompt_draw`; credo.capabilities)."""
    backend_needs: frozenset = frozenset()
    """Capabilities the rollout backend must provide for this stage (a source with soft prefixes: `prompt_embeds`)."""


@dataclass(frozen=True)
class FamilyParts:
    """A family's build-time parts (its build module's `PARTS`); each optional. See the module docstring."""

    check_names: Callable[[Any], None] | None = None
    """check_names(recipe): the names its section uses resolve (env ids); raises ConfigError."""
    preflight: Callable[[Any], list] | None = None
    """preflight(recipe) -> notes: what its section points at exists (model folders), before any warm-up."""
    task: Callable[[Any], Any] | None = None
    """task(recipe) -> the run's task, when the family makes it (a multi-turn env's expert episodes)."""
    evaluator: Callable[..., Any] | None = None
    """evaluator(ctx, source, temperature) -> the held-out evaluation (with a `metric`)."""
    hooks: Callable[..., list] | None = None
    """hooks(ctx, parts) -> [StepHook], called around every train step."""
    warmup: Callable[..., tuple] | None = None
    """warmup(recipe, task, policy_path, log=) -> (policy_path, key): its own cached warm-up after credo's."""
    warmup_plan: Callable[..., dict | None] | None = None
    """warmup_plan(recipe, task, policy_path, base_path) -> {name, steps, batch, flops, cached, folder} or None:
    `credo check`'s view of that warm-up (credo.warmup_estimate)."""


def _never(r: Any) -> bool:
    return False


def _nothing(r: Any) -> dict:
    return {}


def _zero(r: Any) -> int:
    return 0


@dataclass(frozen=True)
class Family:
    """One family's table entry (see the module docstring for what each field is for)."""

    name: str
    """Short name, e.g. 'critic'."""
    doc: str = ""
    """One line: what the family is, with its paper's arXiv id."""
    section: str | None = None
    """The recipe key of its section; None: the family has no settings of its own."""
    config: type | None = None
    """The section's dataclass (fields with one-line docs and ranges, as the core sections)."""
    check: Callable[[Any], None] | None = None
    """Load-time checks of the recipe (its section with the core keys it depends on); raises ConfigError."""
    stages: Mapping[str, Mapping[str, StageEntry]] = field(default_factory=dict)
    """kind -> stage name -> entry."""
    tasks: Mapping[str, str] = field(default_factory=dict)
    """task name -> 'module:attr' of the task factory."""
    active: Callable[[Any], bool] = _never
    """Whether the family's section is switched on in this recipe."""
    stage_defaults: Callable[[Any], dict] = _nothing
    """kind -> stage name that replaces 'default' when the family is active."""
    warmup_digest: Callable[[Any], dict] = _nothing
    """Entries the warm-up's cache key adds (the family's part of what the demonstrations depend on)."""
    holdout: Callable[[Any], int] = _zero
    """Training problems the default rollout source must not draw (the last ones of the training split)."""
    fixed_on_resume: tuple = ()
    """Keys of its section a resume cannot honour (they shape state in the checkpoint), refused even with
    run.allow_config_change."""
    refusals: tuple = ()
    """`credo.capabilities.Refusal` rows: combinations with its section that cannot run, each with its reason."""
    build: str | None = None
    """The module of its build-time parts (`PARTS = FamilyParts(...)`), imported only when the family is active."""
    commands: Mapping[str, str] = field(default_factory=dict)
    """CLI verb -> 'module:attr' of add_parser(subparsers) -> None: adds `credo <verb>` with its handler set."""
    listing: str | None = None
    """'module:attr' of listing(names) -> str: its part of `credo list`; names(title, items, indent) formats a list."""
    roles: Mapping[str, type] = field(default_factory=dict)
    """Ray role -> the dataclass of its `cluster.<role>:` section (a `RoleConfig` or a subclass)."""

    def settings(self, recipe: Any) -> Any:
        """This family's section of `recipe` (its defaults when the recipe was built without it)."""
        if self.section is None:
            return None
        found = getattr(recipe, self.section, None)
        return found if found is not None else self.config()

    def parts(self) -> FamilyParts:
        """Its build-time parts, checked: the build module's `PARTS` must be a FamilyParts (an empty one when the
        family has no build module)."""
        if self.build is None:
            return FamilyParts()
        return _load_parts(self.name, self.build)


@functools.lru_cache(maxsize=None)
def _load_parts(name: str, module: str) -> FamilyParts:
    found = getattr(importlib.import_module(module), "PARTS", None)
    if not isinstance(found, FamilyParts):
        raise TypeError(f"family '{name}': {module}.PARTS is {type(found).__name__}, expected a credo.family.FamilyParts "
                        "(its build-time parts, each named as a keyword so a misspelt part is an error)")
    return found


def import_spec(spec: str, key: str) -> Any:
    """The object 'package.module:attr' names; a ConfigError naming `key` when it cannot be imported."""
    return _import_named(spec, f"config key '{key}'")


def _import_named(spec: str, where: str) -> Any:
    """The object 'package.module:attr' names; a ConfigError that starts with `where` when it cannot be imported."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where} = '{spec}': expected 'package.module:attr'")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{where} = '{spec}': cannot import module '{module}' ({e})") from None
    if not hasattr(obj, attr):
        raise ConfigError(f"{where} = '{spec}': module '{module}' has no attribute '{attr}'")
    return getattr(obj, attr)


@functools.lru_cache(maxsize=None)
def builtin_families() -> tuple[Family, ...]:
    """The families shipped in credo/families/ (their tables import only their config modules)."""
    table = importlib.import_module("credo.families")
    return tuple(table.builtin_families())


@functools.lru_cache(maxsize=None)
def load_families(specs: tuple[str, ...] = ()) -> tuple[Family, ...]:
    """The built-in families plus the external ones a recipe names in `families:` ('pkg.mod:attr')."""
    found = list(builtin_families())
    for i, spec in enumerate(specs):
        if not isinstance(spec, str):
            raise ConfigError(f"config key 'families[{i}]' = {spec!r}: expected 'package.module:attr'")
        fam = import_spec(spec, f"families[{i}]")
        if not isinstance(fam, Family):
            raise ConfigError(f"config key 'families[{i}]' = '{spec}' is a {type(fam).__name__}, expected a "
                              "credo.family.Family")
        found.append(fam)
    _check_unique(found)
    return tuple(found)


def _check_unique(families: list[Family]) -> None:
    """Family names, section keys, stage names and task names may each be claimed once."""
    seen: dict[tuple, str] = {}
    for fam in families:
        claims = [("family", fam.name)] + ([("section", fam.section)] if fam.section else [])
        claims += [(f"{kind} stage", name) for kind, names in fam.stages.items() for name in names]
        claims += [("task", name) for name in fam.tasks]
        claims += [("command", verb) for verb in fam.commands] + [("cluster role", role) for role in fam.roles]
        for claim in claims:
            if claim in seen:
                raise ConfigError(f"the {claim[0]} '{claim[1]}' is claimed by both family '{seen[claim]}' and "
                                  f"family '{fam.name}'")
            seen[claim] = fam.name
        for kind in fam.stages:
            if kind not in KINDS:
                raise ConfigError(f"family '{fam.name}' declares stages of unknown kind '{kind}' "
                                  f"(known: {', '.join(KINDS)})")


def family_commands(families: tuple[Family, ...], taken: set[str] = frozenset()) -> list[tuple[str, Callable]]:
    """(verb, add_parser) of every family's CLI verbs, in table order; a verb module that does not import, or a verb
    the core (`taken`) or another family already has, is a ConfigError naming the family, the verb and its module."""
    out, seen = [], set(taken)
    for fam in families:
        for verb, spec in fam.commands.items():
            key = f"family '{fam.name}' commands['{verb}']"
            if verb in seen:
                raise ConfigError(f"{key} = '{spec}': the verb 'credo {verb}' is already taken")
            seen.add(verb)
            add = _import_named(spec, key)
            if not callable(add):
                raise ConfigError(f"{key} = '{spec}' is a {type(add).__name__}, expected add_parser(subparsers)")
            out.append((verb, add))
    return out


def family_listings(families: tuple[Family, ...]) -> list[Callable]:
    """listing(names) -> text of each family that adds to `credo list`, in table order (ConfigError as above)."""
    return [_import_named(f.listing, f"family '{f.name}' listing") for f in families if f.listing]


def families_of(recipe: Any) -> tuple[Family, ...]:
    """The families a recipe was assembled with (`credo.config.recipe_class`)."""
    table = getattr(type(recipe), "__families__", None)
    return table if table is not None else load_families(tuple(getattr(recipe, "families", ()) or ()))


def active_families(recipe: Any) -> list[Family]:
    return [f for f in families_of(recipe) if f.active(recipe)]


def stage_entry(families: tuple[Family, ...], kind: str, name: str) -> tuple[Family, StageEntry] | None:
    """(family, entry) of the stage `name` of `kind` some family declares, or None."""
    for fam in families:
        entry = fam.stages.get(kind, {}).get(name)
        if entry is not None:
            return fam, entry
    return None


def stage_names(families: tuple[Family, ...], kind: str) -> list[str]:
    return sorted({name for fam in families for name in fam.stages.get(kind, {})})


def task_factory(families: tuple[Family, ...], name: str) -> str | None:
    for fam in families:
        if name in fam.tasks:
            return fam.tasks[name]
    return None


def warmup_digest(recipe: Any) -> dict:
    """The active families' additions to the warm-up's cache key."""
    out: dict = {}
    for fam in active_families(recipe):
        out.update(fam.warmup_digest(recipe))
    return out


def close_names(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else ""


def section_fields(families: tuple[Family, ...]) -> list[tuple[str, type, Any]]:
    """(key, dataclass, field) of each family section, in table order, for `dataclasses.make_dataclass`."""
    return [(f.section, f.config, dataclasses.field(default_factory=f.config)) for f in families if f.section]
