"""The two credit rules of Complementary RL (arXiv 2603.17621), as pure functions.

    paired_gain           the extractor's reward: the actor's mean return with a candidate lesson minus its mean
                          return with the baseline context (the task's current bank entry, or no lesson), on paired
                          rollouts: the same env seeds and the same sampling seeds in both arms
    conditional_group_ids the actor's advantage groups: episodes of one game (prompt) that were shown the same
                          experience (entry id and version, or none) share a group, so the GRPO baseline of an
                          episode is taken among episodes that saw the same context (conditional advantage
                          estimation; the grouping key is inferred from the abstract)
    with_minus_without    an entry's help measured on the actor's own batch (its with-lesson episodes of a game
                          minus its without-lesson episodes of the same game)
"""

from __future__ import annotations

import torch


def paired_gain(with_returns: torch.Tensor, base_returns: torch.Tensor, valid: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Per candidate: mean over pairs of (return with the candidate - return in the baseline arm).

    Args:
        with_returns: [C, M] float, candidate c's m-th paired episode. base_returns: [M] float, the baseline arm's
            m-th episode (same env seed and sampling seed as column m of every candidate).
        valid: [C, M] bool (both episodes of the pair finished without an env failure); None = all valid.
    Returns:
        [C] float: the mean difference over valid pairs (0 for a candidate with no valid pair).
    """
    diff = with_returns.double() - base_returns.double()[None, :]
    v = torch.ones_like(diff, dtype=torch.bool) if valid is None else valid.bool()
    n = v.sum(-1)
    return torch.where(n > 0, (diff * v).sum(-1) / n.clamp_min(1), torch.zeros_like(n, dtype=torch.double)).float()


def conditional_group_ids(games: list[int], contexts: list[object], group_size: int) -> torch.Tensor:
    """Group ids per (game, experience context).

    Args:
        games: [N] the game (prompt) index of each episode; global over ranks, each game's episodes on one rank.
        contexts: [N] a hashable context per episode (e.g. (entry id, version), or None without a lesson).
        group_size: episodes per game (G), an upper bound of the contexts one game can have.
    Returns:
        [N] long: game * G + the order in which the context first appears among that game's episodes, so ids are
        unique over ranks and two episodes share one exactly when they share game and context.
    """
    seen: dict[int, dict] = {}
    out = []
    for g, c in zip(games, contexts):
        local = seen.setdefault(g, {})
        if c not in local:
            local[c] = len(local)
        if local[c] >= group_size:
            raise ValueError(f"game {g} has more than group_size = {group_size} contexts")
        out.append(g * group_size + local[c])
    return torch.tensor(out, dtype=torch.long)


def with_minus_without(returns: list[float], games: list[int], shown: list[bool], valid: list[bool]
                       ) -> dict[int, float]:
    """Per game that has both kinds of valid episodes: mean return with the lesson - mean return without it."""
    sums: dict[int, list[float]] = {}
    for r, g, s, ok in zip(returns, games, shown, valid):
        if ok:
            acc = sums.setdefault(g, [0.0, 0.0, 0.0, 0.0])  # with sum, with n, without sum, without n
            acc[0 if s else 2] += r
            acc[1 if s else 3] += 1
    return {g: a[0] / a[1] - a[2] / a[3] for g, a in sums.items() if a[1] and a[3]}
