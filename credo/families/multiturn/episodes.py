"""One step's episodes of the multi-turn source, phase by phase (`MultiTurnRollout.run_episodes` runs them):

    reset_episodes   each env reset (one after another), the prompt rendered, an expert prefix replayed
    model_turn       every live episode's next turn, in one generate call, cut to the token budget
    env_step         every acting episode's env step, in threads with a deadline; observations appended (mask 0)
    episode_stats    the step's sums: episodes, failures, timeouts, returns, turns, how episodes ended

An env call that raises or overruns env.step_timeout_s ends its episode as failed; nobody waits past the deadline
(a hung call is abandoned in a daemon thread, which cannot block the process's exit).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from credo.distributed.rollout import Sample
from credo.families.multiturn.transcript import episode_turns


def call_with_deadline(calls: list, timeout_s: float) -> list[tuple[str, object]]:
    """Run `calls` (zero-argument callables) in daemon threads; each result is ('ok', value), ('error', exc)
    or ('timeout', None) when it has not returned `timeout_s` after the start."""
    out: list = [("timeout", None)] * len(calls)

    def run(i, fn):
        try:
            out[i] = ("ok", fn())
        except BaseException as e:  # noqa: BLE001 - any env error ends only its episode
            out[i] = ("error", e)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [out[i] if not t.is_alive() else ("timeout", None) for i, t in enumerate(threads)]


@dataclass
class Episode:
    env: object
    env_seed: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    chunk_ids: list[int] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    first_observation: str = ""
    prefix_actions: list[str] = field(default_factory=list)
    version: int = 0
    end: str | None = None
    error: str | None = None
    last_info_metrics: dict | None = None
    """`info["episode_metrics"]` of the last env step, when the env reports it (env_metrics.py)."""

    @property
    def done(self) -> bool:
        return self.end is not None

    def sample(self, fallback_prompt: list[int]) -> Sample:
        meta = {"turn_rewards": self.turn_rewards, "turn_spans": self.turn_spans, "chunk_ids": self.chunk_ids,
                "terminated": self.end == "terminated", "truncated": self.end not in ("terminated", "failed"),
                "end": self.end, "failed": self.end == "failed", "error": self.error, "env_seed": self.env_seed,
                "actions": self.actions, "observations": self.observations, "prefix_actions": self.prefix_actions,
                "turns": episode_turns(self.first_observation, self.actions, self.observations, self.turn_rewards,
                                       self.prefix_actions, self.end)}
        return Sample(self.prompt_ids or list(fallback_prompt), self.response_ids, self.response_mask, self.log_probs,
                      finished=self.end == "terminated", policy_version=self.version, meta=meta)


def observation_text(obs, info) -> str:
    """An observation as the model reads it: GEM keeps the board / next-move prompt in info['suffix']."""
    suffix = info.get("suffix") if isinstance(info, dict) else None
    return f"{obs}\n{suffix}" if suffix else str(obs)


def reset_episodes(eps: list[Episode], tok, first_prompt, observation, cfg) -> int:
    """Reset every episode's env (one after another: GEM's reset seeds the global `random`, so parallel resets would
    race), render its prompt (`first_prompt(first_observation) -> str`), replay its prefix if it has one, and end it
    as max_total_tokens when its prompt leaves no room. Returns the resets' and replays' timeouts."""
    timeouts = 0
    for e in eps:
        (status, res), = call_with_deadline([lambda e=e: e.env.reset(seed=e.env_seed)], cfg.step_timeout_s)
        timeouts += status == "timeout"
        if status != "ok":
            e.end, e.error = "failed", f"reset: {status} {res!r}"
            continue
        e.first_observation = observation_text(*res)
        e.prompt_ids = tok(first_prompt(e.first_observation), add_special_tokens=False)["input_ids"]
        if e.prefix_actions:
            ok, overran = replay_prefix(e, tok, observation, cfg.step_timeout_s)
            timeouts += overran
            if not ok:
                continue
        if len(e.prompt_ids) + 1 > cfg.max_total_tokens:
            e.end = "max_total_tokens"
    return timeouts


def replay_prefix(e: Episode, tok, observation, timeout_s: float) -> tuple[bool, int]:
    """Step episode `e`'s env through its prefix actions, appending each action (+ EOS) and observation to its
    prompt. (ok, timeouts): not ok (the episode ended as failed) when the env fails or the prefix ends the game."""
    for k, action in enumerate(e.prefix_actions):
        (status, res), = call_with_deadline([lambda a=action: e.env.step(a)], timeout_s)
        if status != "ok":
            e.end, e.error = "failed", f"prefix step {k}: {status} {res!r}"
            return False, int(status == "timeout")
        obs, _, terminated, truncated, info = res
        if terminated or truncated:  # an expert prefix stops before the expert's last turn: not expected
            e.end, e.error = "failed", f"prefix step {k}: the game ended during the replayed prefix"
            return False, 0
        e.prompt_ids = e.prompt_ids + tok(action, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] \
            + tok(observation(observation_text(obs, info)), add_special_tokens=False)["input_ids"]
    return True, 0


def model_turn(eps: list[Episode], live: list[int], backend, tok, cfg, *, temperature: float, top_p: float,
               seeds: list[int] | None) -> list[int]:
    """One model turn of the `live` episodes, sampled in ONE generate call; each turn is cut to the room left under
    env.max_total_tokens. Returns the episodes whose turn fit (they act in the env); the others end here."""
    contexts = [eps[i].prompt_ids + eps[i].response_ids for i in live]
    outs = backend.generate(contexts, max_new_tokens=cfg.max_new_tokens_per_turn, temperature=temperature,
                            top_p=top_p, seeds=seeds)
    acting = []
    for i, ctx, o in zip(live, contexts, outs):
        e = eps[i]
        room = cfg.max_total_tokens - len(ctx)
        ids, lps = list(o.response_ids)[:room], list(o.rollout_log_probs)[:room]
        start = len(e.response_ids)
        e.response_ids += ids
        e.response_mask += [1] * len(ids)
        e.log_probs += lps + [0.0] * (len(ids) - len(lps))
        e.chunk_ids += [len(e.turn_spans)] * len(ids)
        e.turn_spans.append([start, start + len(ids)])
        e.version = o.policy_version
        e.actions.append(tok.decode(ids, skip_special_tokens=True))
        if len(o.response_ids) > room:  # the turn did not fit: cut, no env step
            e.turn_rewards.append(0.0)
            e.end = "max_total_tokens"
        else:
            acting.append(i)
    return acting


def env_step(eps: list[Episode], acting: list[int], tok, observation, cfg, turn: int) -> int:
    """Step the `acting` episodes' envs with their last action (in threads, each with a deadline); record the turn
    reward, end the episode or append the observation (mask 0). Returns the steps' timeouts."""
    results = call_with_deadline([lambda e=eps[i]: e.env.step(e.actions[-1]) for i in acting], cfg.step_timeout_s)
    for i, (status, res) in zip(acting, results):
        apply_env_step(eps[i], status, res, tok, observation, cfg, turn)
    return sum(status == "timeout" for status, _ in results)


def apply_env_step(e: Episode, status: str, res, tok, observation, cfg, turn: int) -> None:
    """Record one env step's outcome (`call_with_deadline`'s status and result) in episode `e`: its turn reward, and
    its end or the observation appended (mask 0)."""
    if status != "ok":
        e.turn_rewards.append(0.0)
        e.end, e.error = "failed", f"step {turn}: {status} {res!r}"
        return
    obs, reward, terminated, truncated, info = res
    e.turn_rewards.append(float(reward))
    if isinstance(info, dict) and isinstance(info.get("episode_metrics"), dict):
        e.last_info_metrics = info["episode_metrics"]
    e.observations.append(observation_text(obs, info))
    if terminated:
        e.end = "terminated"
    elif truncated:
        e.end = "env_truncated"
    elif len(e.prefix_actions) + len(e.turn_spans) >= cfg.max_turns:
        e.end = "max_turns"
    else:
        ids = tok(observation(e.observations[-1]), add_special_tokens=False)["input_ids"]
        # the next turn needs room for at least one token after the observation
        if len(e.prompt_ids) + len(e.response_ids) + len(ids) + 1 > cfg.max_total_tokens:
            e.end = "max_total_tokens"
            return
        e.response_ids += ids
        e.response_mask += [0] * len(ids)
        e.log_probs += [0.0] * len(ids)
        e.chunk_ids += [-1] * len(ids)


def episode_stats(eps: list[Episode], timeouts: int, *, resampled: bool) -> dict[str, float]:
    """The step's sums (all-reduced over ranks by the source): episodes, failures, timeouts, returns, turns, ends."""
    n = len(eps)
    stats = {"env/episodes": float(n), "env/failures": float(sum(e.end == "failed" for e in eps)),
             "env/timeouts": float(timeouts),
             "env/return_sum": sum(sum(e.turn_rewards) for e in eps if e.end != "failed"),
             "env/turns_sum": float(sum(len(e.turn_spans) for e in eps)),
             "env/terminated": float(sum(e.end == "terminated" for e in eps)),
             "env/overflow": float(sum(e.end == "max_total_tokens" for e in eps))}
    if resampled:
        stats["env/resampled"] = float(sum(bool(e.prefix_actions) for e in eps))
        stats["env/prefix_turns_sum"] = float(sum(len(e.prefix_actions) for e in eps))
    return stats
