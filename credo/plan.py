"""The run plan: a recipe resolved once, before any warm-up, into a frozen `RunPlan` that everything after it consumes.

`resolve_plan(recipe)` is the one function that resolves a recipe's names:

    families     the active ones, each with its checked build-time parts (`credo.family.FamilyParts`) and section
    stages       rollout, reward, advantage and each probe: its factory (or the built-in), typed settings, family
                 section, and what it provides and needs (`credo.capabilities`)
    algo         the policy loss, the advantage estimator and the KL estimator, their kwargs against their signatures
    rewards      the reward functions, imported once and their signatures checked
    owners       the family that makes the task and the one that makes the evaluator (two claims are an error)
    schedule     `stages.schedule` with its settings (`credo.schedules`; the deprecated rollout.* keys mapped here)
    backend      hf, vllm or the Ray pool, with what it provides
    engine       the training engine (deepspeed) with what it provides under the recipe's settings
    checks       every requirement of the schedule and the stages against the backend, the source and the engine,
                 then every refusal row (the core's and the active families'): one ConfigError naming both keys

`credo.preflight.preflight(recipe)` resolves the plan and then checks what it points at (model folders, task files,
optional packages), returning the plan with its notes. `credo.train.build.build(plan)`, `credo check`, `credo eval`
and the Python API consume it; nothing else resolves a name, imports a reward function or asks a recipe for its
families.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from credo.capabilities import (BACKENDS, CORE_REFUSALS, COPY_PUSH, DEFAULT_SOURCE, ENGINES, LORA, RAY_PUSH,
                                ROUTING_CAPTURE, VLLM_PUSH, Requirement, check_refusals, check_requirements)
from credo.config.fields import kind_mismatch
from credo.errors import ConfigError
from credo.family import Family, FamilyParts, families_of
from credo.old_log_probs import check_old_log_probs
from credo.schedules import Schedule, schedule, schedule_of
from credo.train.registry import DEFAULT, Resolved, check_factory_call, resolve, settings_of

LOSS_RESERVED = {"log_probs", "old_log_probs", "advantages", "mask", "global_tokens", "global_seqs", "agg_mode", "weights",
                 "rollout_log_probs", "norm_len"}
"""Keywords of a policy loss the trainer sets (algo.loss_kwargs may not)."""
ADV_RESERVED = {"rewards", "group_ids", "mask", "token_rewards", "values"}
"""Keywords of an advantage estimator the trainer sets (algo.advantage_kwargs may not)."""


@dataclass(frozen=True)
class ActiveFamily:
    """A family active in this run: its table entry, its checked build-time parts and its recipe section."""

    family: Family
    parts: FamilyParts
    section: Any


@dataclass(frozen=True)
class StagePlan:
    """One stage resolved: `resolved` is None for the built-in of its kind."""

    kind: str
    key: str
    """The recipe key that named it ('stages.rollout', 'stages.probes[0]')."""
    name: str
    """The name it resolved to: the recipe's, or an active family's replacement of 'default'; 'default' = built-in."""
    resolved: Resolved | None
    settings: Any
    """Its checked settings: a dataclass instance, or the kwargs checked against its factory ({} for a built-in)."""
    settings_key: str
    section: Any
    """The section of the family that declares it (None for a built-in or a stage of no family)."""
    provides: frozenset
    backend_needs: frozenset
    defaulted: bool = False
    """The recipe said 'default' and an active family put this stage in its place."""

    def who(self) -> str:
        fam = self.resolved.family if self.resolved is not None else None
        via = f" (made the default by {fam.section or fam.name})" if fam is not None and self.defaulted else ""
        return f"'{self.key}' = '{self.name}'{via}"


@dataclass(frozen=True)
class SchedulePlan:
    """The rollout schedule resolved: its declaration, checked settings and the key they were read from."""

    spec: Schedule
    settings: Any
    key: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def staleness(self) -> int:
        return self.spec.staleness(self.settings)

    def who(self) -> str:
        return (f"'stages.schedule' = '{self.name}'" if self.key == "stages.schedule_kwargs"
                else f"'{self.key}' (schedule '{self.name}')")


@dataclass(frozen=True)
class RunPlan:
    """A recipe resolved once (see the module docstring). Frozen: build, check, eval and the API read it."""

    recipe: Any
    families: tuple
    """Every family the recipe was assembled with (built-in and its own)."""
    active: tuple
    """The active families (`ActiveFamily`), in table order."""
    stages: Mapping[str, StagePlan]
    """'rollout', 'reward', 'advantage' -> StagePlan."""
    probes: tuple
    """StagePlan per entry of stages.probes."""
    schedule: SchedulePlan
    backend: str
    """'hf', 'vllm', 'vllm_async' (rollout.vllm_engine: async) or 'ray' (the Ray pool of cluster.engine: ray)."""
    engine: str
    provided: Mapping[str, frozenset]
    """'backend', 'source', 'engine' -> what each provides."""
    requirements: tuple
    """Every `Requirement` checked (all met in a plan that exists)."""
    reward_functions: tuple
    """(recipe key, spec, the imported function) of reward.function / reward.functions."""
    task_owner: ActiveFamily | None
    evaluator_owner: ActiveFamily | None
    notes: tuple = ()
    """One line each: what was not checked, and warnings (starting 'warning: ')."""

    @property
    def staleness(self) -> int:
        return self.schedule.staleness

    def needs_backend(self, capability: str) -> bool:
        """Whether any part of the plan needs `capability` of the rollout backend (the vLLM engine is then built
        with it, e.g. prompt embeddings)."""
        return any(q.capability == capability and q.part == "backend" for q in self.requirements)


def resolve_plan(r) -> RunPlan:
    """Resolve every name `r` uses and check every requirement and refusal; raises ConfigError naming the keys."""
    families = families_of(r)
    active = tuple(ActiveFamily(f, f.parts(), f.settings(r)) for f in families if f.active(r))
    defaults = _stage_defaults(active, r)
    _check_algo_names(r, replaced_advantage="advantage" in defaults)
    stages = {kind: _stage_plan(r, kind, defaults, families) for kind in ("rollout", "reward", "advantage")}
    probes = tuple(_probe_plan(r, i, spec, families) for i, spec in enumerate(r.stages.probes))
    for spec in r.stages.probe_kwargs:
        if spec not in r.stages.probes:
            raise ConfigError(f"config key 'stages.probe_kwargs.{spec}' names no entry of stages.probes "
                              f"({r.stages.probes})")
    for a in active:
        if a.parts.check_names is not None:
            a.parts.check_names(r)
    rewards = _reward_functions(r)
    name, kwargs, key, notes = schedule_of(r)
    spec = schedule(name)
    sched = SchedulePlan(spec, settings_of(Resolved(lambda ctx: None, spec.settings), kwargs, key), key)
    if spec.check is not None:
        spec.check(r, sched.settings, key)
    backend = backend_name(r)
    engine = r.engine.backend
    from credo.distributed.engines import check_engine

    check_engine(r)  # the engine's own settings (engine.cpu_offload needs fsdp2)
    provided = {"backend": BACKENDS[backend], "source": stages["rollout"].provides, "engine": ENGINES[engine](r)}
    requirements = _requirements(r, sched, stages, probes, backend, provided)
    plan = RunPlan(recipe=r, families=families, active=active, stages=MappingProxyType(stages), probes=probes,
                   schedule=sched, backend=backend, engine=engine, provided=MappingProxyType(provided),
                   requirements=tuple(requirements), reward_functions=rewards,
                   task_owner=_owner(active, "task"), evaluator_owner=_owner(active, "evaluator"),
                   notes=tuple(notes) + tuple(async_warnings(r, sched.staleness, name)) + tuple(check_old_log_probs(r)))
    check_requirements(requirements)
    check_refusals([*CORE_REFUSALS, *(row for a in active for row in a.family.refusals)], r, plan)
    return plan


def backend_name(r) -> str:
    """The `BACKENDS` entry a recipe runs: 'ray' (cluster.engine: ray), 'vllm_async' (rollout.backend vllm with
    rollout.vllm_engine: async) or rollout.backend."""
    if r.cluster.engine == "ray":
        return "ray"
    if r.rollout.backend == "vllm" and r.rollout.vllm_engine == "async":
        return "vllm_async"
    return r.rollout.backend


def _requirements(r, sched: SchedulePlan, stages: dict, probes: tuple, backend: str, provided: dict) -> list:
    backend_key = {"ray": "'cluster.engine' = 'ray'", "vllm_async": "'rollout.vllm_engine' = 'async'"}.get(
        backend, f"'rollout.backend' = '{backend}'")
    source = stages["rollout"]
    engine_key = (f"'engine.zero_stage' = {r.engine.zero_stage} (engine deepspeed)" if r.engine.backend == "deepspeed"
                  else f"'engine.backend' = '{r.engine.backend}'")
    out = [Requirement(sched.who(), c, source.who(), provided["source"], "a schedule needs it of the rollout source",
                       "source") for c in sorted(sched.spec.source_needs)]
    out += [Requirement(sched.who(), c, backend_key, provided["backend"], part="backend")
            for c in sorted(sched.spec.backend_needs)]
    out += [Requirement(sched.who(), c, engine_key, provided["engine"], part="engine")
            for c in sorted(sched.spec.engine_needs)]
    ro = r.rollout
    push = {"hf": COPY_PUSH, "vllm": VLLM_PUSH, "vllm_async": VLLM_PUSH, "ray": RAY_PUSH}[backend]  # both vLLM
    # engines load through weight_sync.push_weights
    copies = [(backend_key, backend != "hf"), (f"'rollout.dtype' = '{ro.dtype}'", ro.dtype is not None),
              ("'rollout.fp8_weights' = true", ro.fp8_weights)]
    out += [Requirement(who, push, engine_key, provided["engine"],
                        "the rollout engine takes the policy's full weights from the trainer at every sync", "engine")
            for who, on in copies if on][:1]
    if r.model.lora.r:
        out.append(Requirement(f"'model.lora.r' = {r.model.lora.r}", LORA, engine_key, provided["engine"], part="engine"))
    if r.algo.router_replay:
        out.append(Requirement("'algo.router_replay' = true", ROUTING_CAPTURE, backend_key, provided["backend"],
                               "the rollout must record each token's MoE experts to replay them", "backend"))
    for stage in (*stages.values(), *probes):
        out += [Requirement(stage.who(), c, backend_key, provided["backend"], part="backend")
                for c in sorted(stage.backend_needs)]
    return out


def _stage_defaults(active: tuple, r) -> dict[str, tuple[str, Family]]:
    """kind -> (stage name, family) an active family puts in place of 'default'; two claims are an error."""
    out: dict[str, tuple[str, Family]] = {}
    for a in active:
        for kind, name in a.family.stage_defaults(r).items():
            if kind in out:
                raise ConfigError(f"families '{out[kind][1].name}' and '{a.family.name}' are both active and both "
                                  f"replace the default {kind} stage; switch one of them off")
            out[kind] = (name, a.family)
    return out


def _owner(active: tuple, part: str) -> ActiveFamily | None:
    """The one active family with build part `part` (task, evaluator); two is an error."""
    owners = [a for a in active if getattr(a.parts, part) is not None]
    if len(owners) > 1:
        raise ConfigError(f"families '{owners[0].family.name}' and '{owners[1].family.name}' are both active and both "
                          f"make the run's {part}; switch one of them off")
    return owners[0] if owners else None


def _stage_plan(r, kind: str, defaults: dict, families: tuple) -> StagePlan:
    key = f"stages.{kind}"
    spec = getattr(r.stages, kind)
    kwargs = getattr(r.stages, f"{kind}_kwargs")
    defaulted = spec == DEFAULT and kind in defaults
    if defaulted:
        spec = defaults[kind][0]
    resolved = resolve(kind, spec, key, families)
    if resolved is None:
        if kwargs:
            raise ConfigError(f"config key 'stages.{kind}_kwargs' is set but stages.{kind} is 'default', whose settings "
                              "live in their own sections; name the stage they are for")
        return StagePlan(kind, key, DEFAULT, None, {}, f"{key}_kwargs", None,
                         DEFAULT_SOURCE if kind == "rollout" else frozenset(), frozenset())
    return dataclasses.replace(_planned(r, kind, key, spec, resolved, kwargs, f"{key}_kwargs"), defaulted=defaulted)


def _probe_plan(r, i: int, spec, families: tuple) -> StagePlan:
    key = f"stages.probes[{i}]"
    if not isinstance(spec, str):
        raise ConfigError(f"config key '{key}' = {spec!r}: expected a name or 'package.module:factory'")
    resolved = resolve("probe", spec, key, families)
    if resolved is None:
        raise ConfigError(f"config key '{key}': there is no default probe; name one")
    return _planned(r, "probe", key, spec, resolved, r.stages.probe_kwargs.get(spec, {}), f"stages.probe_kwargs.{spec}")


def _planned(r, kind, key, spec, resolved: Resolved, kwargs, settings_key) -> StagePlan:
    settings = settings_of(resolved, kwargs, settings_key)
    if resolved.settings is None:  # called as factory(ctx, **kwargs): a function that cannot be is named now
        check_factory_call(resolved.factory, settings, key, spec, settings_key)
    if hasattr(settings, "check_dependencies"):  # a stage's optional package, now rather than after the warm-up
        settings.check_dependencies(settings_key)
    section = resolved.family.settings(r) if resolved.family is not None else None
    return StagePlan(kind, key, spec, resolved, settings, settings_key, section, resolved.provides,
                     resolved.backend_needs)


def _check_algo_names(r, *, replaced_advantage: bool) -> None:
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
    if algos.ADVANTAGE_INPUTS.get(a.advantage) != "outcome" and not replaced_advantage:
        raise ConfigError(f"config key 'algo.advantage' = '{a.advantage}' needs per-token rewards or a value "
                          "model; this trainer takes outcome estimators (e.g. grpo, rloo, lite_ppo), or gae with a critic: section")
    if a.advantage in GROUP_ESTIMATORS and r.rollout.group_size < 2:
        raise ConfigError(f"config key 'rollout.group_size' = {r.rollout.group_size} is out of range: expected >= 2 with "
                          f"algo.advantage = '{a.advantage}', whose baseline is the group mean (a group of one gets "
                          "advantage 0 and no gradient); use more samples per prompt or a batch estimator (reinforce_pp)")


def _check_name(name: str, registry: dict, key: str) -> None:
    from credo.family import close_names

    if name not in registry:
        raise ConfigError(f"config key '{key}' = '{name}' is not a known name{close_names(name, list(registry))} "
                          f"(known: {', '.join(sorted(registry))})")


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
        defaults = [sig.parameters[k].default for sig in (outer, inner) if k in sig.parameters]
        wrong = kind_mismatch(f"{key}.{k}", kwargs[k], defaults[0] if defaults else None)
        if wrong:
            raise ConfigError(wrong)



def _reward_functions(r) -> tuple:
    """(key, spec, fn) of each reward function the recipe names: imported now, not at step 1 after the model has
    loaded, and callable as fn(responses, problems) or TRL's way (it names `completions`)."""
    specs = [("reward.function", r.reward.function)] if r.reward.function else []
    specs += [(f"reward.functions[{i}]", s) for i, s in enumerate(r.reward.functions)]
    if not specs:
        return ()
    from credo.rewards.functions import is_trl_style
    from credo.rewards.worker import import_reward_fn

    out = []
    for key, spec in specs:
        fn = import_reward_fn(spec, key)
        if not is_trl_style(fn):
            _check_group_signature(fn, spec, key)
        out.append((key, spec, fn))
    return tuple(out)


def _check_group_signature(fn, spec: str, key: str) -> None:
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


def reads_behaviour_policy(loss: str, loss_kwargs: dict) -> bool:
    """Whether policy loss `loss` with `loss_kwargs` uses the sampler's log-probs mu (`rollout_log_probs`): a
    correction (TIS, MIS: decoupled PPO is ppo + tis), the ratio against mu (`behaviour_ratio`, TOPR and CISPO as ROLL
    runs them), or a kernel that reads them itself (IPA's chunk filter, MIPU's weights)."""
    from credo import algos

    if loss_kwargs.get("correction") in ("tis", "mis") or loss_kwargs.get("behaviour_ratio"):
        return True
    return "rollout_log_probs" in inspect.signature(algos.POLICY_LOSSES[loss]).parameters


def async_warnings(r, staleness: int, schedule_name: str = "") -> list[str]:
    """Warnings on an asynchronous schedule (staleness S > 0) whose loss ignores the behaviour policy: it then
    treats samples of a policy S versions old as if the recomputed pi_old had drawn them."""
    a = r.algo
    # algo.old_log_probs: rollout makes pi_old the sampler's mu: the ratio is then against the behaviour policy
    if staleness == 0 or a.old_log_probs == "rollout" or reads_behaviour_policy(a.policy_loss, a.loss_kwargs):
        return []
    return [f"warning: stages.schedule '{schedule_name}' with max_staleness = {staleness} and algo.policy_loss "
            f"'{a.policy_loss}', which ignores the behaviour policy (its ratio is against the recomputed pi_old, not the sampler's mu); set "
            "algo.loss_kwargs.correction: tis (decoupled PPO) or mis, or behaviour_ratio: true (TOPR, CISPO), or a "
            "loss that reads the sampler's log-probs (ipa, mipu)"]


def with_notes(plan: RunPlan, notes: list[str]) -> RunPlan:
    """The plan with `notes` added after its own."""
    return dataclasses.replace(plan, notes=plan.notes + tuple(notes))
