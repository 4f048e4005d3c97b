"""Response-length distributions: parametric (the papers' shape) or fitted from a run's rollout dumps.

Lengths are drawn per prompt, because a long-tail prompt tends to produce long responses (tail batching works
only because of that, arXiv 2509.21009): each prompt draws its own log-median, then its responses scatter around
it,

    log L_ij = log(median) + sigma_prompt * z_i + sigma_response * e_ij,   z, e ~ N(0, 1)

rounded and clipped to [min_len, max_len]. `empirical` resamples whole groups from a dump: a prompt is a group
of one dumped step, its responses are drawn from that group's lengths (without replacement up to the group's
size, so a group keeps its longest; with replacement beyond).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class LengthModel:
    kind: str = "lognormal"
    """'lognormal', 'empirical' (groups from rollout dumps) or 'fixed'."""
    median: float = 256.0
    """Median response length in tokens (lognormal)."""
    sigma_prompt: float = 0.8
    """Log-space spread between prompts (lognormal)."""
    sigma_response: float = 0.3
    """Log-space spread between the responses of one prompt (lognormal)."""
    min_len: int = 1
    """Shortest response (tokens)."""
    max_len: int = 4096
    """The length cap (rollout.max_new_tokens): longer responses are truncated to it."""
    fixed: int = 0
    """Every response's length (fixed)."""
    groups: list = field(default_factory=list)
    """Per-prompt response lengths (empirical): a list of lists."""
    order: str = "random"
    """empirical: 'random' draws a group per prompt and responses from it (a shuffle); 'cycle' takes the groups in
    turn and a group's lengths in order (deterministic: hand-worked scenarios, replaying a dump's groups)."""
    prompt_len: int = 64
    """Prompt tokens per prompt."""
    replay: list = field(default_factory=list)
    """Per step, the (prompt_len, response_len) of every sample of a measured run (kind 'replay', sync only)."""


def dump_paths(pattern: str) -> list[Path]:
    """The files a glob names (absolute or relative), or a directory's rollouts/step_*.jsonl."""
    base = Path(pattern)
    if base.is_dir():
        found = sorted(base.glob("rollouts/step_*.jsonl")) or sorted(base.glob("step_*.jsonl"))
    else:
        anchor = Path(base.anchor) if base.is_absolute() else Path()
        found = sorted(anchor.glob(str(base.relative_to(anchor)) if base.is_absolute() else pattern))
    return found


def model_from_dict(d: dict, where: str = "workload.lengths") -> LengthModel:
    """A LengthModel from a scenario's mapping; `dumps: <glob or run dir>` fits an empirical model from dumps."""
    d = dict(d)
    known = set(LengthModel.__dataclass_fields__) | {"dumps"}
    for k in d:
        if k not in known:
            raise ValueError(f"{where}.{k} is not a length key (known: {', '.join(sorted(known))})")
    if "dumps" in d:
        paths = dump_paths(str(d.pop("dumps")))
        if not paths:
            raise ValueError(f"{where}.dumps matches no rollout dump (expected rollouts/step_*.jsonl files)")
        m = fit_dumps(paths, max_len=d.get("max_len"))
        if "prompt_len" in d:
            m.prompt_len = int(d["prompt_len"])
        return m
    m = LengthModel(**d)
    if m.kind not in ("lognormal", "empirical", "fixed", "replay"):
        raise ValueError(f"{where}.kind = {m.kind!r}: expected lognormal, empirical, fixed or replay")
    if m.order not in ("random", "cycle"):
        raise ValueError(f"{where}.order = {m.order!r}: expected random or cycle")
    if m.kind == "replay" and not m.replay:
        raise ValueError(f"{where}.replay is empty: kind: replay needs the per-step (prompt_len, length) pairs")
    if m.kind == "fixed" and m.fixed < 1:
        raise ValueError(f"{where}.fixed = {m.fixed}: expected >= 1 with kind: fixed")
    if m.kind == "empirical" and not m.groups:
        raise ValueError(f"{where}.groups is empty: kind: empirical needs groups (or dumps: to fit them)")
    if not 1 <= m.min_len <= m.max_len:
        raise ValueError(f"{where}: expected 1 <= min_len ({m.min_len}) <= max_len ({m.max_len})")
    return m


def draw_prompt(m: LengthModel, rng: random.Random, index: int = 0):
    """One prompt's identity for later response draws: its log-median (lognormal) or group (empirical; with
    order 'cycle', group index % len(groups))."""
    if m.kind == "lognormal":
        return math.log(m.median) + m.sigma_prompt * rng.gauss(0.0, 1.0)
    if m.kind == "empirical":
        return index % len(m.groups) if m.order == "cycle" else rng.randrange(len(m.groups))
    return None


def draw_responses(m: LengthModel, prompt, n: int, rng: random.Random) -> list[int]:
    """n response lengths of one prompt drawn by draw_prompt."""
    if m.kind == "fixed":
        return [m.fixed] * n
    if m.kind == "empirical":
        group = m.groups[prompt]
        if m.order == "cycle":
            picks = [group[j % len(group)] for j in range(n)]
        else:  # without replacement while the group lasts: with replacement, a group's longest is often missed
            picks = rng.sample(group, min(n, len(group))) + [rng.choice(group) for _ in range(n - len(group))]
        return [min(m.max_len, max(m.min_len, x)) for x in picks]
    out = []
    for _ in range(n):
        x = round(math.exp(prompt + m.sigma_response * rng.gauss(0.0, 1.0)))
        out.append(min(m.max_len, max(m.min_len, x)))
    return out


def read_dump_groups(paths: list[Path]) -> tuple[list[list[int]], list[int]]:
    """Response lengths grouped by prompt (one group per (step, group_id)), and prompt lengths, from
    `rollouts/step_*.jsonl` files written by `run.dump_rollouts_every`."""
    groups: dict[tuple, list[int]] = {}
    prompt_lens: dict[tuple, int] = {}
    for path in paths:
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = (row["step"], row["group_id"], str(path))
                    n = sum(row["response_mask"]) if row.get("response_mask") else len(row["response_ids"])
                    prompt_lens[key] = len(row["prompt_ids"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{line_no}: not a rollout dump row ({e}); expected the fields step, "
                                     "group_id, prompt_ids, response_ids (credo's run.dump_rollouts_every)") from None
                groups.setdefault(key, []).append(int(n))
    if not groups:
        raise ValueError(f"no rollout rows in {[str(p) for p in paths]}: expected rollouts/step_*.jsonl files")
    keys = sorted(groups)
    return [groups[k] for k in keys], [prompt_lens[k] for k in keys]


def fit_dumps(paths: list[Path], max_len: int | None = None) -> LengthModel:
    """An empirical LengthModel from rollout dumps, with its lognormal summary (median and the between- and
    within-prompt log spreads) filled in for reporting."""
    groups, prompt_lens = read_dump_groups(paths)
    flat = np.array([x for g in groups for x in g], dtype=float)
    logs = [np.log(np.maximum(g, 1)) for g in groups]
    means = np.array([lg.mean() for lg in logs])
    within = np.concatenate([lg - lg.mean() for lg in logs])
    sizes = np.array([len(g) for g in groups])
    within_var = float((within ** 2).sum() / max(1, (sizes - 1).sum())) if (sizes > 1).any() else 0.0
    return LengthModel(kind="empirical", groups=groups, median=float(np.median(flat)),
                       sigma_prompt=float(means.std()), sigma_response=math.sqrt(within_var),
                       min_len=int(flat.min()), max_len=int(max_len or flat.max()),
                       prompt_len=int(round(float(np.mean(prompt_lens)))))


def quantiles(lengths, qs=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)) -> dict[float, float]:
    """Quantiles of a list of lengths (numpy's linear interpolation)."""
    arr = np.asarray(lengths, dtype=float)
    return {q: float(np.quantile(arr, q)) for q in qs}
