"""Running agents against the gateway: the agent contract of issue 54 (a recipe names it: `rollout.agent`).

An agent is a function `run_episode(*, base_url, api_key, model, task) -> float | dict[str, float]` (named by an
entry point string, `"mypkg.agent:run_episode"`): it talks to the gateway with any OpenAI client, and returns the
episode's reward, a float or a dict of named rewards (their sum is the reward). `run_episodes` calls it once per
task, each episode with its own API key (so its calls are recorded under its own episode id), up to
`max_concurrent` at a time, and returns per episode its reward, its error if any, and its trajectories with the
reward attached for the credit (credo.gateway.rewards).

Failures are isolated, as env failures are in the multi-turn source: an agent that raises, returns something that
is not a reward, or runs past `timeout_s` fails its episode only (its trajectories are marked failed: they train
nothing), the others go on, and `gateway/agent_failures` / `gateway/agent_timeouts` count them. A thread cannot be
killed, so a timed-out agent is abandoned: its episode is closed, and any later call it makes is refused (HTTP 409).

`credo.distributed.ray.agents.RayAgentRunner` runs the same contract with each episode a Ray task (agent.placement:
ray), sharing `episode_prefix` and `episode_result` with `run_episodes`.
"""

from __future__ import annotations

import importlib
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # not at import: a Ray agent task imports this module for `load_agent` only (no torch there)
    from credo.distributed.rollout import Sample

log = logging.getLogger("credo.gateway")


@dataclass
class EpisodeResult:
    episode: str
    """The episode id its calls were recorded under."""
    task: dict
    reward: float
    """The episode's reward (the sum of the named rewards); 0.0 when it failed."""
    rewards: dict[str, float] = field(default_factory=dict)
    """The named rewards as the agent returned them ({"reward": x} for a float)."""
    error: str | None = None
    """Why the episode failed (the agent raised, timed out, or returned no reward); None when it did not."""
    trajectories: list[Sample] = field(default_factory=list)
    """Its trajectories (EpisodeStore.take), `meta["turn_rewards"]` and `meta["failed"]` set."""
    seconds: float = 0.0


def load_agent(spec: str) -> Callable:
    """The function an entry point `"package.module:function"` names; ValueError naming the spec otherwise."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"agent entry point {spec!r}: expected 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"agent entry point {spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ValueError(f"agent entry point {spec!r} names a {type(fn).__name__}, not a function")
    return fn


def named_rewards(value) -> dict[str, float]:
    """An agent's return value as named rewards; ValueError for anything but a finite float or a dict of them."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = {"reward": float(value)}
    elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        out = {k: float(v) for k, v in value.items()}
    else:
        raise ValueError(f"the agent returned {value!r:.80}; expected a float or a dict of named floats")
    bad = [k for k, v in out.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"the agent returned a non-finite reward for {', '.join(bad)}")
    return out


def run_episodes(agent: Callable | str, tasks: list[dict], gateway, *, model: str, max_concurrent: int = 8,
                 timeout_s: float = 600.0, prefix: str | None = None) -> list[EpisodeResult]:
    """Run `agent` once per task against `gateway` (a started `credo.gateway.Gateway`); results in task order.
    Episode ids are `<prefix>-<i>` (a fresh random prefix by default: an abandoned agent of an earlier call can
    never write into a new episode)."""
    prefix = episode_prefix(tasks, gateway, max_concurrent, prefix)
    fn = load_agent(agent) if isinstance(agent, str) else agent
    slots = threading.Semaphore(max_concurrent)
    guard = threading.Lock()
    outcome: list[dict] = [{} for _ in tasks]

    def free(i: int) -> None:
        """Give episode i's slot back, once (when its agent returns, or when it is abandoned at its timeout)."""
        with guard:
            if not outcome[i].get("freed"):
                outcome[i]["freed"] = True
                slots.release()

    def one(i: int, task: dict, episode: str) -> None:
        start = time.monotonic()
        try:
            outcome[i]["value"] = fn(base_url=gateway.base_url, api_key=gateway.episode_key(episode), model=model,
                                     task=dict(task))
        except BaseException as e:  # noqa: BLE001 - an agent's failure is its episode's, never the run's
            outcome[i]["error"] = f"the agent raised {type(e).__name__}: {e}"
        outcome[i]["seconds"] = time.monotonic() - start
        free(i)

    threads: list[tuple[threading.Thread, str, float]] = []
    for i, task in enumerate(tasks):
        while not slots.acquire(timeout=0.05):  # every slot busy: abandon the agents past their timeout
            _reap_timeouts(threads, outcome, gateway, timeout_s, free)
        episode = f"{prefix}-{i}"
        t = threading.Thread(target=one, args=(i, task, episode), name=f"credo-agent-{episode}", daemon=True)
        t.start()
        threads.append((t, episode, time.monotonic()))
    for t, _, started in threads:
        t.join(max(0.0, started + timeout_s - time.monotonic()))
    _reap_timeouts(threads, outcome, gateway, timeout_s, free, final=True)
    return [episode_result(f"{prefix}-{i}", task, outcome[i], gateway) for i, task in enumerate(tasks)]


def episode_prefix(tasks: list[dict], gateway, max_concurrent: int, prefix: str | None) -> str:
    """The checks every runner makes before its first episode; the episodes' id prefix (a fresh random one by
    default). ValueError for max_concurrent < 1, a task that is not a dict, or an episode id already used."""
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    bad = [i for i, t in enumerate(tasks) if not isinstance(t, dict)]
    if bad:
        raise ValueError(f"tasks[{bad[0]}] is a {type(tasks[bad[0]]).__name__}; each task must be a dict (its row)")
    prefix = prefix or f"episode-{secrets.token_hex(4)}"
    used = [f"{prefix}-{i}" for i in range(len(tasks)) if f"{prefix}-{i}" in gateway.store.closed
            or gateway.store.episode_calls(f"{prefix}-{i}")]
    if used:
        raise ValueError(f"episode id {used[0]!r} is already in use on this gateway; pass another prefix")
    return prefix


def _reap_timeouts(threads, outcome, gateway, timeout_s: float, free, final: bool = False) -> None:
    """Close the episodes whose agent is still running past its timeout, and free their slots."""
    now = time.monotonic()
    for i, (t, episode, started) in enumerate(threads):
        if t.is_alive() and "timed_out" not in outcome[i] and (final or now - started > timeout_s):
            outcome[i]["timed_out"], outcome[i]["seconds"] = True, now - started
            gateway.store.close(episode)
            free(i)


def episode_result(episode: str, task: dict, out: dict, gateway) -> EpisodeResult:
    """Episode `episode`'s result from its runner's outcome (`value`, or `error`, or `timed_out`; `seconds`): the
    reward checked, failures and timeouts counted and logged, its trajectories taken from the store."""
    from credo.gateway.rewards import attach_episode_reward

    error, rewards = out.get("error"), {}
    if out.get("timed_out"):
        error = "the agent ran past its timeout"
        gateway.store.count("gateway/agent_timeouts")
    elif error is None:
        try:
            rewards = named_rewards(out.get("value"))
        except ValueError as e:
            error = str(e)
    if error is not None:
        gateway.store.count("gateway/agent_failures")
        log.warning("gateway: episode %s failed: %s", episode, error)
    reward = sum(rewards.values()) if error is None else 0.0
    call_rewards = gateway.store.take_call_rewards(episode)  # per-turn rewards reported through POST /credo/reward
    trajectories = attach_episode_reward(gateway.store.take(episode), reward, call_rewards=call_rewards,
                                         failed=error is not None)
    return EpisodeResult(episode, dict(task), reward, rewards, error, trajectories, out.get("seconds", 0.0))
