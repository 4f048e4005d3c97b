"""The simulator's outputs: a markdown table of the step-time breakdown and a stacked-bar plot."""

from __future__ import annotations

import math
from pathlib import Path

from credo.simulate.runner import ModeResult


def _fmt(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def markdown_table(results: list[ModeResult], baseline: str) -> str:
    """One row per mode: step time, its breakdown (rollout, reward, train, sync), idle, occupancy, speed-up."""
    head = ("| mode | kind | step (s) | rollout (s) | reward (s) | train (s) | sync (s) | idle / device (s) | "
            "slot occupancy | speed-up vs " + baseline + " | notes |")
    lines = [head, "|" + "---|" * 11]
    for r in results:
        notes = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.stats.items() if v)
        lines.append(f"| {r.name} | {r.mode} | {_fmt(r.step_time_s)} | {_fmt(r.rollout_s)} | {_fmt(r.reward_s)} | "
                     f"{_fmt(r.train_s)} | {_fmt(r.sync_s)} | {_fmt(r.idle_s)} | {_fmt(r.occupancy)} | "
                     f"{r.speedup:.2f}x | {notes} |")
    return "\n".join(lines) + "\n"


def plot(results: list[ModeResult], path: Path, title: str) -> Path:
    """Stacked bars of each mode's seconds per step (rollout, reward, train, sync), speed-up on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(results), 3.6))
    names = [r.name for r in results]
    bottom = [0.0] * len(results)
    parts = [("rollout", "rollout_s", "#4c72b0"), ("reward", "reward_s", "#dd8452"), ("train", "train_s", "#55a868"),
             ("sync", "sync_s", "#c44e52")]
    for label, attr, color in parts:
        vals = [getattr(r, attr) for r in results]
        ax.bar(names, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(results):
        ax.text(i, max(bottom[i], r.step_time_s) * 1.01, f"{r.step_time_s:.3g}s\n{r.speedup:.2f}x", ha="center",
                va="bottom", fontsize=8)
    ax.set_ylabel("seconds per step (critical path)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, max(max(bottom), max(r.step_time_s for r in results)) * 1.25)
    ax.legend(fontsize=8, loc="upper right")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
