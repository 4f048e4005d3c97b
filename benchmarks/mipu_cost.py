"""Wall-time cost of MIPU step 2 against step 1 only, measured in one process.

    nice -n 5 python benchmarks/mipu_cost.py --steps 6 --rounds 2

Builds a `Trainer` of recipes/mipu.yaml (evaluation and checkpoints off) with step 2 off (step 1 only: the
`mipu` loss) and on (snapshot, validation rollouts on the held-out prompts, T_post, accept or roll back),
`rounds` times each, alternating, in this process, and prints the median wall time of `train_step` after
the first step of each trainer (which warms caches), and the ratio. Extra `key=value` arguments override
the recipe (e.g. `mipu.val_prompts=16`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def step_times(overrides: list[str], out: Path, steps: int) -> tuple[list[float], float, list[float]]:
    from credo.config import load_recipe
    from credo.trainer import Trainer

    r = load_recipe(REPO / "recipes" / "mipu.yaml", [f"run.output_dir={out}", f"run.steps={steps}", "run.eval_every=0",
                                                    "run.save_every=0", "run.progress=false", "run.plot=false",
                                                    *overrides])
    trainer = Trainer(r)
    times, rollbacks, gate = [], 0.0, []
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            row = trainer.train_step(step)
            times.append(time.perf_counter() - t0)
            rollbacks = row.get("mipu/rollback_rate", 0.0)
            gate.append(row.get("perf/mipu_s", 0.0))
    finally:
        trainer.close()
    return times[1:], rollbacks, gate[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-mipu-cost-"))
    variants = {"step 1 only": ["mipu.enabled=false"], "step 1 + step 2 (MIPU)": ["mipu.enabled=true"]}
    times: dict[str, list[float]] = {n: [] for n in variants}
    gate: list[float] = []
    rate = 0.0
    for i in range(args.rounds):
        for j, (name, over) in enumerate(variants.items()):
            t, rb, g = step_times([*over, *args.overrides], tmp / f"{i}-{j}", args.steps)
            times[name] += t
            gate += g if "MIPU" in name else []
            rate = rb if "MIPU" in name else rate
    base = statistics.median(times["step 1 only"])
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:24s} median step {m:.3f} s over {len(t)} steps  ratio {m / base:.2f}x")
    print(f"median perf/mipu_s (snapshot, validation, decision, any restore + re-sync): "
          f"{statistics.median(gate):.3f} s")
    print(f"MIPU rollback rate in the last round: {rate:.2f}")


if __name__ == "__main__":
    main()
