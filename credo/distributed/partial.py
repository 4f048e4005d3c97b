"""Partial rollout: a request interrupted by new weights keeps its tokens and continues under the new version.

ROLL Flash (arXiv 2510.11345) and verl's fully-async trainer interrupt in-flight generations at a weight update and
continue them with the new weights; AReaL (arXiv 2505.24298) calls it interruptible generation. Here:

    generate        the request's prompts, per-sample seeded (`HFBackend(per_sample_seeds=True)`), asking
                    `newer(version)` after every decoded token
    interrupt       when newer weights are published, every unfinished row stops at that token
    take            the new weights are loaded (`take(version) -> version`)
    continue        each unfinished row goes on from prompt + partial response under the new weights; its seeded
                    noise is that of its own response positions (`first_positions`), so a request that no update
                    interrupts draws exactly the tokens of one uninterrupted call

Each token records the version that sampled it (`Sample.policy_versions`) and its behaviour log-prob under that
version (`Sample.rollout_log_probs`), so the off-policy corrections (TIS/MIS, decoupled PPO) weigh every token by the
policy that actually drew it. `Sample.policy_version` is the oldest token's version: a sample's staleness counts from
its oldest token. `meta['interrupted']` counts the interruptions the sample went through.

The continued row is re-read whole under the new weights (a new prefill, no KV cache kept across the interruption):
what AReaL and verl do when they recompute the KV cache after a weight update; reusing the old cache would mix the
two versions inside one token's attention.
"""

from __future__ import annotations

from typing import Callable

from credo.distributed.rollout import Sample


def generate_partial(backend, prompts: list[list[int]], seeds: list[int], *, max_new_tokens: int,
                     temperature: float, top_p: float, version: int, newer: Callable[[int], bool],
                     take: Callable[[int], int]) -> list[Sample]:
    """Sample one response per prompt, interrupted and continued whenever newer weights arrive (module docstring).

    Args:
        backend: an `HFBackend` with `per_sample_seeds=True`, holding the weights of `version`.
        prompts, seeds: one seed per prompt (the request's draw).
        newer(v): whether weights newer than version v are published (asked after each token).
        take(v): load the newest weights into `backend`; returns their version.
    Returns:
        One `Sample` per prompt with `policy_versions` (per response token) and `meta['interrupted']`.
    """
    if not backend.per_sample_seeds:
        raise ValueError("partial rollout needs a backend with per_sample_seeds=True: a continued request must draw "
                         "the tokens one uninterrupted call would have drawn")
    n = len(prompts)
    tokens: list[list[int]] = [[] for _ in range(n)]
    log_probs: list[list[float]] = [[] for _ in range(n)]
    versions: list[list[int]] = [[] for _ in range(n)]
    finished, interrupted = [False] * n, [0] * n
    first_version = version
    active = list(range(n))
    while active:
        held = version
        room = max(max_new_tokens - len(tokens[i]) for i in active)
        steps = [0]

        def interrupt() -> bool:  # asked once per decoded token: counts the call's decode steps
            steps[0] += 1
            return newer(held)

        out = backend.generate([list(prompts[i]) + tokens[i] for i in active], max_new_tokens=room,
                               temperature=temperature, top_p=top_p, seeds=[seeds[i] for i in active],
                               first_positions=[len(tokens[i]) for i in active], stop_when=interrupt)
        # the call ran to its length cap unless the interruption stopped it (a row's trailing padding tokens are
        # cut from its sample, so its own length cannot tell)
        capped = steps[0] >= room
        still = []
        for i, s in zip(active, out):
            keep = max_new_tokens - len(tokens[i])  # rows continued from fewer tokens had more room
            tokens[i] += s.response_ids[:keep]
            log_probs[i] += s.rollout_log_probs[:keep]
            versions[i] += [held] * len(s.response_ids[:keep])
            if s.finished and len(s.response_ids) <= keep:
                finished[i] = True
            elif not capped and len(tokens[i]) < max_new_tokens:  # interrupted: on under the new weights
                still.append(i)
                interrupted[i] += 1
        active = still
        if active:
            version = take(version)
    return [Sample(list(p), tokens[i], [1] * len(tokens[i]), log_probs[i], finished[i],
                   min(versions[i]) if versions[i] else first_version, meta={"interrupted": interrupted[i]},
                   policy_versions=versions[i])
            for i, p in enumerate(prompts)]
