"""P-GenRM's pieces (arXiv 2602.12116): evaluation-chain parsing, user prototypes, and dual-granularity
test-time scaling. The synthetic users and the task that trains on them (PSI SFT, CRE GRPO) are
`credo.families.judges.pgenrm.task`, the scaling evaluation `credo.families.judges.pgenrm.scaling`; the curriculum is not built.

- An evaluation chain ends with the two responses' scores: the paper's JSON
  ``"better_response": {"response_1": s1, "response_2": s2}``, or ``\\boxed{s1, s2}`` for a tiny model.
- Prototypes (from the released code, spec 08 §3): user embeddings L2-normalised, k-means on the unit
  sphere (cosine assignment, centroids re-normalised), the nearest prototype of a query, and its top-k
  most similar members.
- Dual-granularity scaling (spec 08 §4, the code's fusion): s = (c_self * mean(individual chains) +
  c_nb * mean(neighbour chains)) / (c_self + c_nb), c_self = c_nb = 0.5; unparseable chains are skipped.
"""

from __future__ import annotations

import json
import math
import re

import torch

_PAIR = re.compile(r"\\boxed\{\s*([0-9]+(?:\.[0-9]+)?)\s*,\s*([0-9]+(?:\.[0-9]+)?)\s*\}")


def parse_evaluation_chain(text: str, lo: float = 1, hi: float = 10) -> tuple[float, float] | None:
    """(s1, s2) from the chain's `better_response` JSON or its last ``\\boxed{s1, s2}``; None when missing,
    malformed or out of [lo, hi]. Never raises on a string."""
    pair = None
    i = text.rfind('"better_response"')
    if i >= 0:
        j = text.find("{", i)
        k = text.find("}", j)
        if j >= 0 and k > j:
            try:
                d = json.loads(text[j:k + 1])
                pair = (float(d["response_1"]), float(d["response_2"]))
            except (ValueError, KeyError, TypeError):
                pair = None
    if pair is None:
        found = _PAIR.findall(text)
        if found:
            pair = (float(found[-1][0]), float(found[-1][1]))
    if pair is None or not all(math.isfinite(s) and lo <= s <= hi for s in pair):
        return None
    return pair


def kmeans_sphere(x: torch.Tensor, k: int, *, iters: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Spherical k-means of unit rows.

    Args:
        x: [N, d] embeddings (normalised here).
        k: prototypes, 1 <= k <= N.

    Returns:
        centroids [k, d] (unit rows), assignment [N] long (the most cosine-similar centroid).
    """
    if x.ndim != 2 or not 1 <= k <= x.shape[0]:
        raise ValueError(f"x has shape {list(x.shape)} and k = {k}: expected [N, d] with 1 <= k <= N")
    x = torch.nn.functional.normalize(x.float(), dim=-1)
    g = torch.Generator().manual_seed(seed)
    # k-means++ seeding on cosine distance
    first = int(torch.randint(x.shape[0], (1,), generator=g))
    chosen = [first]
    for _ in range(1, k):
        d = (1 - x @ x[chosen].T).clamp_min(0).min(1).values
        chosen.append(int(torch.multinomial(d + 1e-12, 1, generator=g)))
    c = x[chosen].clone()
    assign = torch.zeros(x.shape[0], dtype=torch.long)
    for _ in range(iters):
        assign = (x @ c.T).argmax(1)
        new = torch.zeros_like(c).index_add_(0, assign, x)
        empty = new.norm(dim=-1) == 0
        new[empty] = c[empty]  # an empty cluster keeps its centroid
        new = torch.nn.functional.normalize(new, dim=-1)
        if torch.allclose(new, c):
            break
        c = new
    return c, (x @ c.T).argmax(1)


def prototype_neighbours(q: torch.Tensor, centroids: torch.Tensor, members: torch.Tensor, assign: torch.Tensor,
                         topk: int) -> torch.Tensor:
    """Indices (into members) of the `topk` members of q's nearest prototype most cosine-similar to q.

    Args:
        q: [d]; centroids: [K, d]; members: [N, d]; assign: [N] prototype of each member.
    """
    qn = torch.nn.functional.normalize(q.float(), dim=-1)
    j = int((centroids @ qn).argmax())
    idx = (assign == j).nonzero()[:, 0]
    sims = torch.nn.functional.normalize(members[idx].float(), dim=-1) @ qn
    return idx[sims.argsort(descending=True)[:topk]]


def fuse_scores(self_scores: list, neighbour_scores: list, c_self: float = 0.5, c_nb: float = 0.5) -> tuple | None:
    """Dual-granularity fusion of chains' (s1, s2) pairs (None = unparseable, skipped).

    Returns:
        (s1, s2) = (c_self * mean(self) + c_nb * mean(neighbours)) / (c_self + c_nb), a level with no valid chain
        left out; None when no chain parsed.
    """
    parts = []
    for scores, c in ((self_scores, c_self), (neighbour_scores, c_nb)):
        ok = [s for s in scores if s is not None]
        if ok and c > 0:
            parts.append((c, [sum(s[i] for s in ok) / len(ok) for i in (0, 1)]))
    if not parts:
        return None
    w = sum(c for c, _ in parts)
    return tuple(sum(c * m[i] for c, m in parts) / w for i in (0, 1))
