"""Every combination of features either trains or is refused by `credo check` (issue 51): the matrix, generated from
the tables themselves (the family recipes, the schedules in credo/schedules/, the rollout backends, local or Ray,
packing on or off, the training engine, truncated sampling on or off, pi_old recomputed or the sampler's; the
distillation teacher's placement as recipe variants).

    python benchmarks/combinations.py plan                  # every cell through `credo check`'s checks: accepted or
                                                            # refused (and why); seconds a cell
    python benchmarks/combinations.py train --jobs 1        # then a pairwise covering set of the accepted cells
                                                            # trains 2 steps each (short warm-ups), in subprocesses
    python benchmarks/combinations.py train --out docs/results/combinations.json
    python benchmarks/combinations.py train --carry docs/results/combinations.json --out FILE
                                                            # cells trained in FILE before count as trained; the
                                                            # covering set trains only what covers the pairs left

A cell is refused only by a ConfigError naming both keys at fault ('config keys ... and ...'); any other error, or an
accepted cell that fails to train, is a failure of the matrix. tests/plan/test_combinations.py runs the plan step
over every cell (the check is cheap) and trains a few cells; the covering set trains here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RECIPES = ("quickstart", "ppo", "asyppo", "multiturn", "mipu", "attention_credit", "judge_reward", "rm_nlhf", "ce_rm",
           "pgenrm", "complementary", "polymath", "palette", "shop", "longtail", "distill", "moe", "gateway_gem",
           "distill@worker", "distill@ray", "gateway_gem@ray")
"""Every family's recipe (the asynchronous recipes are schedules of these, so they are the schedule axis here).
`recipe@variant` is a recipe with one of its family's placements (RECIPE_VARIANTS)."""
# distill@ray: the teacher's actor beside the rollout's on a 2-CPU Ray, half a CPU each (whole CPUs: 3 asked of 2,
# refused by `credo check`'s placement check; the first train run of 2026-12-07 met it at two cells)
RECIPE_VARIANTS = {"distill@worker": ["distill.placement=worker"],
                   "distill@ray": ["distill.placement=ray", "cluster.teacher.resources={CPU: 0.5}",
                                   "cluster.rollout.resources={CPU: 0.5}"],
                   "gateway_gem@ray": ["agent.placement=ray"]}  # the agent's episodes as Ray tasks (docs/gateway.md)
"""The distillation teacher in its own process, or as Ray actors (`distill.placement`; `trainer` is plain distill);
the gateway agent's episodes as Ray tasks (`agent.placement: ray`; plain gateway_gem runs them in threads)."""
BACKENDS = ("hf", "vllm", "vllm_async")
"""rollout.backend, and vLLM's engine: offline `LLM` (vllm) or AsyncLLM (vllm_async: rollout.vllm_engine=async)."""
ENGINES = ("local", "ray")
PACKING = (False, True)
TRAIN_ENGINES = ("deepspeed", "fsdp2")
"""engine.backend: the training engine."""
TRUNCATION = (False, True)
"""Truncated sampling with kept-set replay (rollout.top_k=20, rollout.kept_set_replay=true) or not."""
OLD_LOG_PROBS = ("recompute", "rollout")
"""algo.old_log_probs: pi_old recomputed by the trainer, or the sampler's log-probs standing in for it."""

FAST = ["run.steps=2", "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false", "sft.steps=4"]
"""Overrides of every trained cell: two steps after a 4-step warm-up (the warm-up is cached per recipe)."""
FAST_BY_RECIPE = {
    "palette": ["palette.vae_steps=2", "palette.sft_steps=2"],
    "judge_reward": ["judge.warmup_steps=2"],
    "complementary": ["complementary.extractor_sft_steps=2"],
    "distill": ["distill.teacher_sft={noisy_frac: 0.0, steps: 4}"],
}
"""A family's own warm-up, shortened the same way."""


def schedules() -> tuple[str, ...]:
    from credo.schedules import BUILTIN

    return BUILTIN


@dataclass(frozen=True)
class Cell:
    recipe: str
    schedule: str
    backend: str
    engine: str
    packing: bool
    train_engine: str = "deepspeed"
    truncation: bool = False
    old_log_probs: str = "recompute"

    def overrides(self) -> list[str]:
        out = [] if self.schedule == "sync" else [f"stages.schedule={self.schedule}"]
        out += RECIPE_VARIANTS.get(self.recipe, [])
        out += {"hf": [], "vllm": ["rollout.backend=vllm"],
                "vllm_async": ["rollout.backend=vllm", "rollout.vllm_engine=async"]}[self.backend]
        out += [] if self.engine == "local" else ["cluster.engine=ray", "cluster.num_cpus=2"]
        out += ["algo.packing=true"] if self.packing else []
        out += [] if self.train_engine == "deepspeed" else [f"engine.backend={self.train_engine}"]
        out += ["rollout.top_k=20", "rollout.kept_set_replay=true"] if self.truncation else []
        out += [] if self.old_log_probs == "recompute" else [f"algo.old_log_probs={self.old_log_probs}"]
        return out

    def path(self) -> str:
        return str(REPO / "recipes" / f"{self.recipe.partition('@')[0]}.yaml")


def cells() -> list[Cell]:
    return [Cell(*c) for c in itertools.product(RECIPES, schedules(), BACKENDS, ENGINES, PACKING, TRAIN_ENGINES,
                                                    TRUNCATION, OLD_LOG_PROBS)]


def plan_cell(cell: Cell, full: bool = False) -> tuple[str, str]:
    """('accepted', '') or ('refused', the message): the run plan's checks (`full`: all of `credo check`'s)."""
    from credo.config import load_recipe
    from credo.errors import ConfigError

    try:
        r = load_recipe(cell.path(), cell.overrides())
        if full:
            from credo.train.build import check_run

            check_run(r)
        else:
            from credo.plan import resolve_plan

            resolve_plan(r)
    except ConfigError as e:
        return "refused", str(e)
    return "accepted", ""


def names_both_keys(message: str) -> bool:
    """A refusal names the two keys at fault ('config keys X and Y ...')."""
    return message.startswith("config keys ") and " and " in message


def covering(accepted: list[Cell], done: list[Cell] = ()) -> list[Cell]:
    """A pairwise covering subset of `accepted`: every pair of values of two factors that some accepted cell has is
    in one chosen cell or in a cell of `done` (trained before) (greedy: the cell covering most uncovered pairs first)."""
    def pairs(c: Cell) -> set:
        values = list(enumerate(astuple(c)))
        return {(a, b) for a, b in itertools.combinations(values, 2)}

    uncovered = set().union(*(pairs(c) for c in accepted)) if accepted else set()
    for c in done:
        uncovered -= pairs(c)
    chosen = []
    while uncovered:
        best = max(accepted, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


FACTORS = ("recipe", "schedule", "backend", "engine", "packing", "train_engine", "truncation", "old_log_probs")


def astuple(c: Cell) -> tuple:
    return tuple(getattr(c, f) for f in FACTORS)


def name(c: Cell) -> str:
    """A cell's run folder name (the factors added later appear only when not at their first value, so a cell
    without them keeps the name it had before)."""
    extra = ([c.train_engine] if c.train_engine != "deepspeed" else []) + (["topk"] if c.truncation else []) + \
        (["mu"] if c.old_log_probs == "rollout" else [])
    return "-".join(map(str, [*astuple(c)[:5], *extra]))


def train_cell(cell: Cell, out: Path, timeout_s: float = 1800) -> tuple[int, float, str]:
    """(return code, seconds, the last lines of stderr) of `credo run` on the cell, two steps after short warm-ups."""
    over = cell.overrides() + FAST + FAST_BY_RECIPE.get(cell.recipe.partition("@")[0], []) + [f"run.output_dir={out}"]
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-m", "credo.cli", "run", cell.path(), *over], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        rc, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = 124, (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr)
    tail = "\n".join((err or "").strip().splitlines()[-6:])
    if rc == 0 and not (out / "metrics.jsonl").exists():
        rc, tail = 1, "no metrics.jsonl"
    return rc, time.time() - t0, tail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["plan", "train"])
    p.add_argument("--full", action="store_true", help="all of credo check's checks per cell, not only the plan's")
    p.add_argument("--out", default=None, help="write every cell's outcome as JSON here")
    p.add_argument("--runs", default="/tmp/credo-combinations", help="run folders of the trained cells")
    p.add_argument("--only", nargs="*", default=None, help="recipes (default: all)")
    p.add_argument("--carry", default=None,
                   help="an earlier --out file: its trained cells keep their outcome and count as trained")
    p.add_argument("--resume", action="store_true",
                   help="a cell whose run folder already holds run.steps lines of metrics.jsonl is not trained again")
    args = p.parse_args()
    rows = []
    for cell in cells():
        if args.only and cell.recipe not in args.only:
            continue
        status, msg = plan_cell(cell, args.full)
        rows.append({**asdict(cell), "status": status, "message": msg})
    carried = carry(args.carry, rows) if args.carry else []
    accepted = [Cell(**{k: r[k] for k in FACTORS}) for r in rows if r["status"] == "accepted"]
    refused = [r for r in rows if r["status"] == "refused"]
    print(f"{len(rows)} cells: {len(accepted)} accepted, {len(refused)} refused "
          f"({sum(names_both_keys(r['message']) for r in refused)} naming both keys)", flush=True)
    reasons: dict[str, int] = {}
    for r in refused:
        reasons[r["message"]] = reasons.get(r["message"], 0) + 1
    for msg, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {msg}")
    if args.what == "train":
        chosen = covering(accepted, done=carried)
        print(f"training a pairwise covering set of {len(chosen)} accepted cells (beside {len(carried)} trained "
              "before)", flush=True)
        for i, cell in enumerate(chosen):
            out = Path(args.runs) / f"{i:03d}-{name(cell)}"
            row = next(r for r in rows if tuple(r[k] for k in FACTORS) == astuple(cell))
            earlier = sorted(Path(args.runs).glob(f"[0-9][0-9][0-9]-{name(cell)}"))
            if args.resume and any(trained_steps(e) >= 2 for e in earlier):
                row.update(trained=True, rc=0, seconds=None, tail="", resumed=True)
                print(f"done        {' '.join(map(str, astuple(cell)))} (an earlier run)", flush=True)
                continue
            rc, secs, tail = train_cell(cell, out)
            row.update(trained=rc == 0, rc=rc, seconds=round(secs, 1), tail=tail if rc else "")
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {secs:6.0f} s  {' '.join(map(str, astuple(cell)))}"
                  f"{'' if rc == 0 else chr(10) + tail}", flush=True)
            if args.out:  # after every cell, so a crash of the sweep loses no cell already trained
                write(args.out, rows)
    if args.out:
        write(args.out, rows)


def carry(path: str, rows: list[dict]) -> list[Cell]:
    """Copy the training outcome of every cell trained in the file `path` (matched by its factors; a factor the file
    lacks is at its first value) onto `rows`; the cells that trained there and are accepted now."""
    defaults = {f.name: f.default for f in fields(Cell) if f.default is not MISSING}
    earlier = {}
    for r in json.loads(Path(path).read_text())["cells"]:
        if r.get("trained"):
            earlier[tuple(r.get(k, defaults.get(k)) for k in FACTORS)] = r
    done = []
    for row in rows:
        old = earlier.get(tuple(row[k] for k in FACTORS))
        if old is not None and row["status"] == "accepted":
            row.update({k: old[k] for k in ("trained", "rc", "seconds", "tail") if k in old}, carried=True)
            done.append(Cell(**{k: row[k] for k in FACTORS}))
    return done


def trained_steps(out: Path) -> int:
    """How many steps a cell's earlier run logged (0 if none)."""
    f = out / "metrics.jsonl"
    return sum(1 for line in f.read_text().splitlines() if line.strip()) if f.exists() else 0


def write(path: str, rows: list[dict]) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"cells": rows}, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main()
