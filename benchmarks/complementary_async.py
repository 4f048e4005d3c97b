"""Step time of Complementary RL (arXiv 2603.17621) with the extractor after the sync (complementary.extractor_async
false) and beside the actor's next step (true): each run in its own process, the modes interleaved (off, on, off,
on, ...), same seed and warm-up (the actor's from CREDO_CACHE; the extractor's is rebuilt by every run). A step's
time is the wall time of `Trainer.train_step` (rollout to the end of the hook, so the sync mode's extractor work and
the async mode's wait for it are both inside); step 1 is left out (nothing runs beside it).

    python benchmarks/complementary_async.py --reps 2 --steps 6 run.threads=1

Prints one line per run and the medians per mode with their ratio (on / off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one(mode: str, steps: int, out: str, overrides: list[str]) -> None:
    """One run in this process: prints a JSON line of its step times."""
    from credo.config import load_recipe
    from credo.trainer import Trainer

    r = load_recipe(REPO / "recipes" / "complementary.yaml",
                    [f"run.steps={steps}", "run.eval_every=0", "run.save_every=0", "run.plot=false",
                     "run.progress=false", f"run.output_dir={out}", f"complementary.extractor_async={mode}",
                     *overrides])
    trainer = Trainer(r)
    times, rows = [], []
    try:
        for step in range(1, steps + 1):
            t = time.perf_counter()
            rows.append(trainer.train_step(step))
            times.append(time.perf_counter() - t)
    finally:
        trainer.close()
    hook = [row.get("perf/complementary_s", 0.0) for row in rows]
    beside = [row.get("perf/complementary_beside_s") for row in rows]
    print(json.dumps({"mode": mode, "step_s": times, "hook_s": hook, "beside_s": beside,
                      "load1": os.getloadavg()[0]}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2, help="runs per mode, interleaved")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--one", choices=["false", "true"], help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="recipe overrides for every run (e.g. run.threads=1)")
    a = p.parse_args()
    if a.one:
        return one(a.one, a.steps, a.out, a.overrides)
    tmp = Path(tempfile.mkdtemp(prefix="credo-compl-async-"))
    per_mode: dict[str, list[float]] = {"false": [], "true": []}
    for rep in range(a.reps):
        for mode in ("false", "true"):
            cmd = [sys.executable, __file__, "--one", mode, "--steps", str(a.steps), "--out",
                   str(tmp / f"{mode}-{rep}"), *a.overrides]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            res = json.loads(done.stdout.strip().splitlines()[-1])
            per_mode[mode] += res["step_s"][1:]
            print(f"rep {rep} extractor_async={mode}: step s {[round(x, 3) for x in res['step_s']]}  hook s "
                  f"{[round(x, 3) for x in res['hook_s']]}  beside s "
                  f"{[None if x is None else round(x, 3) for x in res['beside_s']]}  load1 {res['load1']:.2f}",
                  flush=True)
    off, on = statistics.median(per_mode["false"]), statistics.median(per_mode["true"])
    print(f"median step s (steps 2..{a.steps}, {a.reps} runs each): off {off:.3f}  on {on:.3f}  on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
