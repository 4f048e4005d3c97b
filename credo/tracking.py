"""The run directory's records: metrics.jsonl (one JSON object per step), curves.png, optional wandb and
TensorBoard, and sample completions of each evaluation (samples/step_<N>.jsonl).

Only rank 0 writes. On resume, `metrics.jsonl` is cut back to the checkpoint's step first, so the
finished file has every step exactly once. `run.progress` draws a tqdm bar on a terminal; without one (output sent
to a file or a pipe) it writes a plain `step N/M` log line every tenth of the run instead, so no `\r` update shares
a line with the log. `python_logging` gives `credo.train` from Python the CLI's view: credo's INFO lines, no
transformers progress bars.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("credo")

PLOT_EVERY = 10
PANELS = [("reward", ("train/reward_mean",), "train/rewards/"), ("eval", (), "eval/"), ("loss", ("train/loss",), None),
          ("KL to reference", ("train/kl",), None), ("entropy", ("train/entropy",), None),
          ("grad norm", ("train/grad_norm",), None), ("response length", ("train/response_len",), None),
          ("cluster: busy fraction", (), ("cluster/", "_busy_frac")),
          ("cluster: workers", ("cluster/worker_restarts",), ("cluster/", "_workers")),
          ("cluster: queue depth", (), ("cluster/", "_queue_depth"))]
"""curves.png: (title, keys always drawn, prefix whose every key is drawn too, or (prefix, suffix)). The eval panel
draws what the run logs under eval/ (accuracy, reward_mean, return, ...); the reward panel adds each reward
function's mean; the cluster panels (runs on Ray) draw each role's busy fraction, worker count and queue depth."""
OPTIONAL_PANELS = {"KL to reference", "cluster: busy fraction", "cluster: workers", "cluster: queue depth"}
"""Drawn only when some row has one of their keys (a reference model; cluster.engine: ray)."""


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


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def panel_keys(rows: list[dict], keys: tuple, prefix: str | tuple[str, str] | None) -> list[str]:
    """`keys`, then every key of `rows` that starts with `prefix` (and ends with the suffix, for a pair) and holds
    a number somewhere, sorted."""
    found = list(keys)
    if prefix:
        start, end = prefix if isinstance(prefix, tuple) else (prefix, "")
        found += sorted({k for r in rows for k, v in r.items() if k.startswith(start) and k.endswith(end)
                         and k not in found and _is_number(v)})
    return found


def curves_figure(rows: list[dict]):
    """One panel per entry of `PANELS` against step (KL only when a row has it), two rows of panels; a panel
    with several keys draws a labelled line per key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(title, panel_keys(rows, keys, prefix)) for title, keys, prefix in PANELS]
    panels = [(t, ks) for t, ks in panels if t not in OPTIONAL_PANELS or any(_is_number(r.get(k)) for r in rows for k in ks)]
    cols = (len(panels) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 5.6), constrained_layout=True, squeeze=False)
    flat = list(axes.flat)
    for ax, (title, keys) in zip(flat, panels):
        drawn = 0
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if _is_number(r.get(key))]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if key.startswith("eval") else None, ms=3, label=key.split("/")[-1])
                drawn += 1
        if drawn > 1:
            ax.legend(fontsize=7)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in flat[len(panels):]:
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


def eval_value(row: dict) -> tuple[str, float] | None:
    """The row's evaluation score as (short name, value): the first numeric eval/* key (a step logs one)."""
    return next(((k[len("eval/"):], v) for k, v in row.items() if k.startswith("eval/") and _is_number(v)), None)


def _short(text, limit: int = 160) -> str:
    text = text if isinstance(text, str) else json.dumps(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_samples(run_dir: str | Path, step: int, prompts: list, completions: list[str], rewards: list,
                  *, keep: int = 16, show: int = 2) -> Path:
    """Write the first `keep` (prompt, completion, reward) of an evaluation to `samples/step_<step>.jsonl` and
    log the first `show` of them (shortened) on the `credo` logger.

    Args:
        prompts: the prompts as the task holds them (a string, or a list of chat messages), one per completion.
        completions: the decoded completions. rewards: one score per completion (float, or None when unscored).
    Returns:
        The file written.
    """
    if not len(prompts) == len(completions) == len(rewards):
        raise ValueError(f"write_samples: {len(prompts)} prompts, {len(completions)} completions and {len(rewards)} "
                         "rewards; expected one of each per sample")
    out = Path(run_dir) / "samples" / f"step_{step}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": step, "prompt": p, "completion": c, "reward": None if r is None else float(r)}
            for p, c, r in list(zip(prompts, completions, rewards))[:keep]]
    tmp = out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, out)
    for r in distinct_prompts(rows, show):
        log.info("eval sample at step %d (reward %s): %s -> %s", step, r["reward"], _short(r["prompt"]),
                 _short(r["completion"]))
    return out


def distinct_prompts(rows: list[dict], show: int) -> list[dict]:
    """The first `show` rows of different prompts (an evaluation with several samples per prompt lists a prompt's
    samples together: the first two would read as one line twice); fewer when there are fewer prompts."""
    seen, out = set(), []
    for r in rows:
        key = json.dumps(r["prompt"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(r)
        if len(out) == show:
            break
    return out


class _NoCpuAcceleratorNote(logging.Filter):
    """Drops DeepSpeed's 'Setting accelerator to CPU. If you have GPU ...' warning, which it logs whenever it is
    imported on a machine without CUDA (transformers imports it through accelerate): on a CPU machine it says what the
    user chose, and `credo check` printed it among its notes (issue 57's round-4 trial). Shown with run.verbose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Setting accelerator to CPU")


CPU_ACCELERATOR_NOTE = _NoCpuAcceleratorNote()


def python_logging() -> None:
    """From Python (`credo.train`), what the CLI sets up: credo's INFO lines on stderr when the program configured
    no logging of its own, and no transformers/hub progress bars (credo has its own progress line)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    logging.getLogger("DeepSpeed").addFilter(CPU_ACCELERATOR_NOTE)


class PlainProgress:
    """`run.progress` without a terminal: a `step N/M` log line every `every` steps and at the last, with the
    step's reward, the last evaluation and the seconds per step (tqdm's interface as the Tracker uses it)."""

    def __init__(self, total: int, initial: int):
        self.total, self.n = total, initial
        self.every = max(1, total // 10)
        self.post: dict = {}
        self.t0, self.n0 = time.monotonic(), initial

    def set_postfix(self, post: dict, refresh: bool = False) -> None:
        self.post = dict(post)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n % self.every and self.n != self.total:
            return
        rate = (time.monotonic() - self.t0) / max(self.n - self.n0, 1)
        extra = "".join(f", {k} {v}" for k, v in self.post.items())
        log.info("step %d/%d (%d%%)%s, %.2f s/step", self.n, self.total, 100 * self.n // max(self.total, 1), extra, rate)

    def close(self) -> None:
        pass


def progress_bar(total: int, initial: int):
    """tqdm on a terminal; `PlainProgress` lines when stderr is a file or a pipe."""
    if not sys.stderr.isatty():
        return PlainProgress(total, initial)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="rl", dynamic_ncols=True)


class Tracker:
    """Appends metrics, redraws curves, mirrors to wandb and TensorBoard, writes evaluation samples and drives
    the progress bar (rank 0 only)."""

    def __init__(self, run_dir: Path, *, total_steps: int, start_step: int, enabled: bool, progress: bool, plot: bool,
                 wandb_cfg: dict | None, config: dict, tensorboard_dir: str | Path | None = None):
        self.run_dir = run_dir
        self.enabled = enabled
        self.plot = plot
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rows = read_metrics(self.metrics_path) if enabled else []
        self.last_eval = next((e for e in map(eval_value, reversed(self.rows)) if e is not None), None)
        self.bar = None
        if enabled and progress:
            self.bar = progress_bar(total_steps, start_step)
        self.wandb = None
        if enabled and wandb_cfg:
            import wandb

            os.environ.setdefault("WANDB_DIR", str(run_dir))
            self.wandb = wandb.init(project=wandb_cfg["project"], mode=wandb_cfg["mode"], name=run_dir.name,
                                    dir=str(run_dir), config=config, resume="allow")
        self.tensorboard = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError("run.tensorboard needs the tensorboard package: pip install 'credo[tensorboard]'") from None
            # purge_step: on resume, TensorBoard hides the events past the checkpoint's step (the rerun rewrites them)
            self.tensorboard = SummaryWriter(str(tensorboard_dir), purge_step=start_step + 1 if start_step else None)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)
        evaluated = eval_value(row)
        if evaluated is not None:
            self.last_eval = evaluated
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        if self.tensorboard is not None:
            for k, v in row.items():
                if k != "step" and _is_number(v):
                    self.tensorboard.add_scalar(k, v, global_step=row["step"])
            self.tensorboard.flush()
        # a redraw costs ~0.15 s, as much as a tiny model's whole RL step: redraw at evals and every 10 steps
        if self.plot and (evaluated is not None or row["step"] % PLOT_EVERY == 0):
            plot_curves(self.rows, self.run_dir / "curves.png")
        if self.bar is not None and row["step"] > 0:  # step 0 is the evaluation before training
            post = {"reward": f"{row.get('train/reward_mean', float('nan')):.3f}"}
            if self.last_eval is not None:
                post[f"eval_{self.last_eval[0]}"] = f"{self.last_eval[1]:.3f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def log_samples(self, step: int, prompts: list, completions: list[str], rewards: list) -> None:
        """An evaluation's sample completions: samples/step_<step>.jsonl, the log, and TensorBoard's text tab."""
        if not self.enabled:
            return
        path = write_samples(self.run_dir, step, prompts, completions, rewards)
        if self.tensorboard is not None:
            table = "\n\n".join(f"**reward {r['reward']}**  \n{_short(r['prompt'], 400)}  \n→ {_short(r['completion'], 400)}"
                                 for r in read_metrics(path)[:4])
            self.tensorboard.add_text("eval/samples", table, global_step=step)
            self.tensorboard.flush()

    def close(self) -> None:
        if self.enabled and self.plot and self.rows:
            plot_curves(self.rows, self.run_dir / "curves.png")
        if self.bar is not None:
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()


def tracked_in_git(path: str | Path) -> bool:
    """Whether `path` is a file git tracks (so a run that appends to it changes a committed file); False outside a
    repository or without git."""
    import subprocess

    p = Path(path).absolute()
    if not p.parent.is_dir():
        return False
    try:
        out = subprocess.run(["git", "ls-files", "--error-unmatch", p.name], cwd=p.parent, capture_output=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0
