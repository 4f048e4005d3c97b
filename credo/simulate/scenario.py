"""Scenario files: the workload, the costs and the modes to compare, read from YAML with every key checked.

    name: rollpacker-7b
    steps: 40                 # training steps per mode
    seed: 0
    baseline: sync            # the mode the others' speed-up is measured against
    workload: {prompts_per_step: 64, group_size: 4, lengths: {kind: lognormal, median: 1200, ...}}
    costs: {decode_step_s: 0.012, decode_seq_s: 4.0e-5, ...}      # defaults for every mode
    modes:
      - {name: sync, mode: sync, devices: 8}
      - {name: tail, mode: tail_batching, devices: 8, prompt_ratio: 1.25, max_responses: 5}

A mode entry may override any `costs` key under its own `costs:`. See docs/simulate.md for every mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

import yaml

from credo.simulate.costs import Costs
from credo.simulate.lengths import LengthModel, model_from_dict

MODES = ("sync", "tail_batching", "async", "agentic_sync", "agentic_async")


@dataclass
class AgentSpec:
    turns_median: float = 8.0
    """Median turns per episode (log-normal, per episode)."""
    turns_sigma: float = 0.5
    """Log-space spread of the turn count."""
    max_turns: int = 30
    """Turn cap."""
    env_latency_s: float = 1.0
    """Median seconds of one environment step (log-normal; runs on CPU, off the rollout devices)."""
    env_sigma: float = 0.8
    """Log-space spread of the environment latency."""
    env_max_s: float = 60.0
    """Environment step timeout: longer steps are cut here."""
    obs_tokens: int = 128
    """Observation tokens appended to the context after each turn (prefilled with the next turn)."""


@dataclass
class Workload:
    prompts_per_step: int = 32
    """Prompts (or episodes' groups) per training step: P0."""
    group_size: int = 8
    """Responses per prompt: R0 (G)."""
    lengths: LengthModel = field(default_factory=LengthModel)
    """Response lengths (per turn for agents); see credo.simulate.lengths."""
    train_padding: str = "padded"
    """'padded': the update pads every row to the batch's longest (credo today); 'packed': no padding."""
    agent: Optional[AgentSpec] = None
    """Multi-turn episodes (agentic modes only)."""


@dataclass
class ServingSpec:
    devices: int = 0
    """Serving devices shared with rollout (ROSE's cooperative elasticity); 0 = none."""
    base_batch: int = 16
    """Serving sequences in flight between bursts."""
    burst_batch: int = 96
    """Serving sequences in flight during a burst."""
    base_mean_s: float = 60.0
    """Mean seconds between bursts (exponential)."""
    burst_mean_s: float = 20.0
    """Mean seconds a burst lasts (exponential)."""
    serving_ctx: int = 1024
    """Context tokens per serving sequence."""
    slo_tpot_s: float = 0.05
    """Serving latency SLO: seconds per output token (one decode step)."""
    guard: str = "reserve"
    """'reserve': rollout admission keeps room for a full burst (SLO-safe); 'none': fills to the SLO at the
    current load and evicts when a burst arrives (violates during the step in progress)."""
    max_batch: int = 256
    """Sequences a serving device holds in all."""
    migrate: bool = True
    """A dedicated device with free slots and an empty queue takes back rollout sequences from serving devices."""


@dataclass
class ModeSpec:
    name: str = ""
    """Label in the table."""
    mode: str = "sync"
    """One of sync, tail_batching, async, agentic_sync, agentic_async."""
    placement: str = "colocated"
    """'colocated': the same devices roll out and train, in turn; 'disaggregated': separate pools."""
    devices: int = 8
    """Devices when colocated."""
    rollout_devices: int = 0
    """Rollout devices (engine instances) when disaggregated."""
    train_devices: int = 0
    """Train devices when disaggregated."""
    max_batch: int = 256
    """Sequences one rollout engine holds at once (0 with engine: static = all of its share in one call)."""
    engine: str = "continuous"
    """'continuous' (vLLM-like batching) or 'static' (transformers generate calls)."""
    dispatch: str = "static"
    """'static' (even shares per engine, verl) or 'queue' (per-sample shared queue, ROLL Flash)."""
    staleness: int = 1
    """async modes: the most policy versions a trained sample may lag (ROLL's async_generation_ratio)."""
    partial_rollout: bool = False
    """async: a weight sync interrupts the sequences in flight; each keeps its tokens, is prefilled again (prompt +
    response so far, costs.prefill_*) and goes on under the new weights; a sample's staleness counts from its
    oldest token (credo's stages.schedule_kwargs.partial_rollout)."""
    old_log_probs: str = "recompute"
    """'recompute': the trainer recomputes pi_old, costs.logprob_token_s per trained token; 'rollout': the
    sampler's log-probs stand in for it, no recompute (credo's algo.old_log_probs, and its S = 0 runs)."""
    prompt_ratio: float = 1.25
    """tail_batching: eta_P, prompts launched per short round over P0."""
    max_responses: int = 0
    """tail_batching: R', responses launched per prompt in a short round (0 = R0 + 1)."""
    finish_quantum: int = 1
    """tail_batching short rounds: a response frees its slot, and its finish is seen, only every this many decode
    steps (credo's hf backend races in generate() chunks of rollout.tail_batching.chunk_tokens); 1 = every step."""
    long_engine: str = ""
    """tail_batching: the engine of long rounds, '' = `engine`, or 'static' (the hf backend's one generate call)."""
    turn_barrier: bool = True
    """agentic_sync: every turn is a batch barrier (True), or episodes run at their own pace and only the step
    waits for the last one (False: environment-level asynchrony inside a synchronous step)."""
    serving: ServingSpec = field(default_factory=ServingSpec)
    """Shared serving devices for elastic rollout (ROSE)."""
    costs: Costs = field(default_factory=Costs)
    """The scenario's costs with this mode's overrides."""


@dataclass
class Scenario:
    name: str
    steps: int
    seed: int
    baseline: str
    workload: Workload
    modes: list
    source: str = ""
    path: Optional[str] = None


def _checked(cls, d, where: str, **extra):
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    for k in d:
        if k not in known:
            raise ValueError(f"{where}.{k} is not a key of {where} (known: {', '.join(sorted(known))})")
    kw = {k: v for k, v in d.items() if k not in extra}
    return cls(**kw, **extra)


def _mode(d: dict, i: int, base_costs: dict, workload: Workload) -> ModeSpec:
    where = f"modes[{i}]"
    d = dict(d)
    costs = Costs.from_dict({**base_costs, **d.pop("costs", {})}, where=f"{where}.costs")
    serving = _checked(ServingSpec, d.pop("serving", {}) or {}, f"{where}.serving")
    m = _checked(ModeSpec, d, where, costs=costs, serving=serving)
    m.name = m.name or m.mode
    if m.mode not in MODES:
        raise ValueError(f"{where}.mode = {m.mode!r}: expected one of {', '.join(MODES)}")
    if m.placement not in ("colocated", "disaggregated"):
        raise ValueError(f"{where}.placement = {m.placement!r}: expected colocated or disaggregated")
    if m.placement == "disaggregated" and (m.rollout_devices < 1 or m.train_devices < 1):
        raise ValueError(f"{where}: placement disaggregated needs rollout_devices >= 1 and train_devices >= 1")
    if m.placement == "colocated" and m.devices < 1:
        raise ValueError(f"{where}.devices = {m.devices}: expected >= 1")
    if m.mode in ("async", "agentic_async") and m.placement != "disaggregated":
        raise ValueError(f"{where}: mode {m.mode} overlaps rollout and training, so it needs placement: disaggregated")
    if m.mode.startswith("agentic") and workload.agent is None:
        raise ValueError(f"{where}: mode {m.mode} needs workload.agent (turns, env latency)")
    if m.engine not in ("continuous", "static"):
        raise ValueError(f"{where}.engine = {m.engine!r}: expected continuous or static")
    if m.engine == "static" and m.mode not in ("sync", "async"):
        raise ValueError(f"{where}: engine static (transformers generate) is modelled for modes sync and async only")
    if m.engine == "static" and m.mode == "async" and (m.max_batch < 1 or m.dispatch != "static"):
        raise ValueError(f"{where}: engine static in mode async is credo's overlap worker: max_batch >= 1 rows per "
                         f"generate call (rollout requests of max_batch / group_size prompts) and dispatch static; "
                         f"got max_batch {m.max_batch}, dispatch {m.dispatch}")
    if not isinstance(m.partial_rollout, bool):
        raise ValueError(f"{where}.partial_rollout = {m.partial_rollout!r}: expected true or false")
    if m.partial_rollout and m.mode != "async":
        raise ValueError(f"{where}.partial_rollout: modelled for mode async only (a synchronous mode has no sequence "
                         f"in flight at a weight sync; agentic_async is not modelled), got mode {m.mode}")
    if m.partial_rollout and m.serving.devices > 0:
        raise ValueError(f"{where}.partial_rollout with serving devices is not modelled")
    if m.old_log_probs not in ("recompute", "rollout"):
        raise ValueError(f"{where}.old_log_probs = {m.old_log_probs!r}: expected recompute or rollout")
    if m.max_batch < 0 or (m.max_batch == 0 and m.engine != "static"):
        raise ValueError(f"{where}.max_batch = {m.max_batch}: expected >= 1 (0 only with engine: static)")
    if m.staleness < 0:
        raise ValueError(f"{where}.staleness = {m.staleness}: expected >= 0")
    if m.finish_quantum < 1:
        raise ValueError(f"{where}.finish_quantum = {m.finish_quantum}: expected >= 1")
    if m.long_engine not in ("", "continuous", "static"):
        raise ValueError(f"{where}.long_engine = {m.long_engine!r}: expected '', continuous or static")
    if m.mode == "tail_batching":
        m.max_responses = m.max_responses or workload.group_size + 1
        if m.prompt_ratio < 1 or m.max_responses < workload.group_size:
            raise ValueError(f"{where}: tail batching needs prompt_ratio >= 1 and max_responses >= group_size "
                             f"({workload.group_size}); got {m.prompt_ratio} and {m.max_responses}")
    if m.serving.guard not in ("reserve", "none"):
        raise ValueError(f"{where}.serving.guard = {m.serving.guard!r}: expected reserve or none")
    return m


def load_scenario(path: str | Path, overrides: dict | None = None) -> Scenario:
    """Read and check a scenario file (`overrides` replace top-level keys, e.g. {'steps': 5})."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"scenario file {path} does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    raw.update(overrides or {})
    return scenario_from_dict(raw, str(path))


def scenario_from_dict(raw: dict, path: str | None = None) -> Scenario:
    top = {"name", "steps", "seed", "baseline", "workload", "costs", "modes", "source"}
    for k in raw:
        if k not in top:
            raise ValueError(f"{path or 'scenario'}: '{k}' is not a scenario key (known: {', '.join(sorted(top))})")
    w = dict(raw.get("workload") or {})
    lengths = model_from_dict(w.pop("lengths", {}) or {})
    agent = w.pop("agent", None)
    workload = _checked(Workload, w, "workload", lengths=lengths,
                        agent=_checked(AgentSpec, agent, "workload.agent") if agent is not None else None)
    if workload.train_padding not in ("padded", "packed"):
        raise ValueError(f"workload.train_padding = {workload.train_padding!r}: expected padded or packed")
    if workload.prompts_per_step < 1 or workload.group_size < 1:
        raise ValueError("workload.prompts_per_step and workload.group_size must be >= 1")
    modes_raw = raw.get("modes") or []
    if not modes_raw:
        raise ValueError(f"{path or 'scenario'}: 'modes' is empty: list at least one mode")
    modes = [_mode(d, i, dict(raw.get("costs") or {}), workload) for i, d in enumerate(modes_raw)]
    names = [m.name for m in modes]
    if len(set(names)) != len(names):
        raise ValueError(f"modes: names must be unique, got {names}")
    baseline = raw.get("baseline", names[0])
    if baseline not in names:
        raise ValueError(f"baseline = {baseline!r} is not a mode name (modes: {', '.join(names)})")
    steps = int(raw.get("steps", 20))
    if steps < 1:
        raise ValueError(f"steps = {steps}: expected >= 1")
    return Scenario(name=str(raw.get("name", Path(path).stem if path else "scenario")), steps=steps,
                    seed=int(raw.get("seed", 0)), baseline=baseline, workload=workload, modes=modes,
                    source=str(raw.get("source", "")), path=path)
