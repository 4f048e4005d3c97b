"""Trajectory-level asynchrony of the multi-turn source (`env.trajectory_async`; RollArc's fine-grained asynchrony,
whose abstract is in docs/async.md): no per-turn barrier across the batch.

The turn-synchronous loop (`MultiTurnRollout.run_episodes`) samples turn t of every live episode in one generate
call, then waits for every env step of turn t, so each turn costs the slowest env step of the batch. Here each
episode advances on its own:

    ready episodes  --one generate call-->  their env steps start (a daemon thread each, with its deadline)
    the first env step to return (or to pass its deadline) --> that episode, and every other one done by then,
                                                              is ready for its next turn

so the generate calls take whoever is ready, and a slow env step delays only its own episode. Each episode's turn t
is seeded as in the turn-synchronous loop (its sample seed, t); the hf sampler draws one stream per generate call,
so which episodes share a call changes its samples (vLLM seeds each request: the same episodes either way). An
env call that raises or overruns env.step_timeout_s ends its episode as failed, as in the synchronous loop.
"""

from __future__ import annotations

import queue
import threading
import time

from credo.families.multiturn.episodes import Episode, apply_env_step, model_turn
from credo.train.rollout import step_seed


def play_trajectories(eps: list[Episode], backend, tok, cfg, observation, *, temperature: float, top_p: float,
                      sample_seeds: list[int] | None) -> tuple[int, int]:
    """Play every live episode of `eps` to its end, each at its own pace. Returns (env timeouts, generate calls)."""
    results: queue.Queue = queue.Queue()
    in_env: dict[int, float] = {}  # episode -> the deadline of its env step in flight
    turns = [len(e.turn_spans) for e in eps]
    ready = [i for i, e in enumerate(eps) if not e.done]
    timeouts = calls = 0
    while ready or in_env:
        if ready:
            seeds = None if sample_seeds is None else [step_seed(sample_seeds[i], turns[i], 0) for i in ready]
            acting = model_turn(eps, ready, backend, tok, cfg, temperature=temperature, top_p=top_p, seeds=seeds)
            calls += 1
            for i in acting:
                in_env[i] = time.monotonic() + cfg.step_timeout_s
                _start_step(eps[i], i, results)
            ready = []
        if not in_env:
            continue
        for i, status, res in _returned(results, min(in_env.values())):
            if in_env.pop(i, None) is None:  # the late answer of a call abandoned at its deadline
                continue
            apply_env_step(eps[i], status, res, tok, observation, cfg, turns[i])
            turns[i] += 1
            if not eps[i].done:
                ready.append(i)
        now = time.monotonic()
        for i in [i for i, deadline in in_env.items() if deadline <= now]:
            del in_env[i]
            timeouts += 1
            apply_env_step(eps[i], "timeout", None, tok, observation, cfg, turns[i])
    return timeouts, calls


def _start_step(e: Episode, i: int, results: queue.Queue) -> None:
    """Episode i's env step with its last action, in a daemon thread (a hung env cannot block the exit)."""
    def run():
        try:
            results.put((i, "ok", e.env.step(e.actions[-1])))
        except BaseException as err:  # noqa: BLE001 - any env error ends only its episode
            results.put((i, "error", err))

    threading.Thread(target=run, daemon=True).start()


def _returned(results: queue.Queue, deadline: float) -> list:
    """The env steps that have returned: waits for the first until `deadline`, then takes every other one done."""
    try:
        out = [results.get(timeout=max(0.0, deadline - time.monotonic()))]
    except queue.Empty:
        return []
    while True:
        try:
            out.append(results.get_nowait())
        except queue.Empty:
            return out
