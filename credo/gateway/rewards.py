"""An episode's reward on its gateway trajectories, in the fields credo's multi-turn credit reads.

The multi-turn family's `turn_credit` stage (GRPO on episode returns, ReBN, IPA with the model's turns as chunks)
reads, per sample, `meta["turn_rewards"]` (one reward per run of mask 1 of the response, i.e. per sampled turn) and
`meta["failed"]`, and the episode return is their sum. `attach_episode_reward` writes them on the trajectories the
gateway assembled (`EpisodeStore.take`), so they go through the same credit functions as the multi-turn source's.

The rule, per trajectory (segment): the episode's outcome reward is on its last turn, and a per-call reward
(`call_rewards[i]`, e.g. reported by a future callback) on the turn that call sampled, in every segment that holds
that turn. Two calls with no token between them (a `/v1/completions` prompt that adds nothing to the last answer)
are one run of mask 1, so one chunk, and their rewards are summed; an empty answer is no chunk, and its reward goes
to the next chunk (or the last). An episode split by drift gives each segment the outcome at its end: with
gamma = 1 every turn's return is the same as in the unsplit episode; with gamma < 1 the turns of an earlier segment
are discounted to its own end, not to the episode's.
"""

from __future__ import annotations

from credo.distributed.rollout import Sample


def attach_episode_reward(trajectories: list[Sample], reward: float, *, call_rewards: dict[int, float] | None = None,
                          failed: bool = False) -> list[Sample]:
    """Set `meta["turn_rewards"]` and `meta["failed"]` on each trajectory, in place; returns them."""
    call_rewards = call_rewards or {}
    for s in trajectories:
        if "calls" not in s.meta or "turns" not in s.meta:
            raise ValueError("attach_episode_reward takes the gateway's trajectories (EpisodeStore.take or "
                             f"trajectories): this sample's meta has no 'calls' and 'turns' (keys: {sorted(s.meta)})")
        calls = s.meta["calls"]
        if len(calls) != len(s.meta["turns"]):
            raise ValueError(f"trajectory {s.meta.get('segment')} of episode {s.meta.get('episode')!r} has "
                             f"{len(s.meta['turns'])} turns but {len(calls)} calls")
        turn_rewards: list[float] = []
        pending, last_end = 0.0, None
        for c, (start, end) in zip(calls, s.meta["turns"]):
            pending += float(call_rewards.get(c, 0.0))
            if start == end:  # an empty answer (a stop string at its start) is no chunk: its reward goes on
                continue
            if start == last_end:  # nothing between two calls' tokens: one run of mask 1, one chunk, one reward
                turn_rewards[-1] += pending
            else:
                turn_rewards.append(pending)
            pending, last_end = 0.0, end
        if turn_rewards:
            turn_rewards[-1] += pending + float(reward)
        s.meta["turn_rewards"] = turn_rewards
        s.meta["failed"] = bool(failed)
    return trajectories
