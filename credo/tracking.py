"""The run directory's records: metrics.jsonl (one JSON object per step), curves.png, optional wandb.

Only rank 0 writes. On resume, `metrics.jsonl` is cut back to the checkpoint's step first, so the
finished file has every step exactly once.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

PLOT_EVERY = 10
CURVES = [("train/reward_mean", "reward"), ("eval/accuracy", "eval accuracy"), ("train/loss", "loss"),
          ("train/kl", "KL to reference"), ("train/entropy", "entropy"), ("train/grad_norm", "grad norm"),
          ("train/response_len", "response length")]
OPTIONAL_CURVES = {"train/kl"}  # drawn only when some row has it (runs with a reference model)


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line from a hard kill
                break
    return rows


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep rows with step <= last_step (and drop a torn final line); atomic rewrite."""
    p = Path(path)
    if not p.exists():
        return
    rows = [r for r in read_metrics(p) if r.get("step", -1) <= last_step]
    tmp = p.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, p)


def curves_figure(rows: list[dict]):
    """One panel per entry of `CURVES` against step (KL only when a row has it), two rows of panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [(k, t) for k, t in CURVES if k not in OPTIONAL_CURVES or any(r.get(k) is not None for r in rows)]
    cols = (len(curves) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 5.6), constrained_layout=True, squeeze=False)
    flat = list(axes.flat)
    for ax, (key, title) in zip(flat, curves):
        pts = [(r["step"], r[key]) for r in rows
               if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if key.startswith("eval") else None, ms=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in flat[len(curves):]:
        ax.set_visible(False)
    return fig


def plot_curves(rows: list[dict], out: str | Path) -> None:
    """`curves_figure(rows)` as one PNG (written atomically)."""
    fig = curves_figure(rows)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    tmp = Path(out).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, out)


class Tracker:
    """Appends metrics, redraws curves, mirrors to wandb and drives the progress bar (rank 0 only)."""

    def __init__(self, run_dir: Path, *, total_steps: int, start_step: int, enabled: bool, progress: bool, plot: bool,
                 wandb_cfg: dict | None, config: dict):
        self.run_dir = run_dir
        self.enabled = enabled
        self.plot = plot
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rows = read_metrics(self.metrics_path) if enabled else []
        self.last_eval = next((r["eval/accuracy"] for r in reversed(self.rows) if "eval/accuracy" in r), None)
        self.bar = None
        if enabled and progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="rl", dynamic_ncols=True)
        self.wandb = None
        if enabled and wandb_cfg:
            import wandb

            os.environ.setdefault("WANDB_DIR", str(run_dir))
            self.wandb = wandb.init(project=wandb_cfg["project"], mode=wandb_cfg["mode"], name=run_dir.name,
                                    dir=str(run_dir), config=config, resume="allow")

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)
        if "eval/accuracy" in row:
            self.last_eval = row["eval/accuracy"]
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        # a redraw costs ~0.15 s, as much as a tiny model's whole RL step: redraw at evals and every 10 steps
        if self.plot and ("eval/accuracy" in row or row["step"] % PLOT_EVERY == 0):
            plot_curves(self.rows, self.run_dir / "curves.png")
        if self.bar is not None and row["step"] > 0:  # step 0 is the evaluation before training
            post = {"reward": f"{row.get('train/reward_mean', float('nan')):.3f}"}
            if self.last_eval is not None:
                post["eval_acc"] = f"{self.last_eval:.3f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.enabled and self.plot and self.rows:
            plot_curves(self.rows, self.run_dir / "curves.png")
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()
