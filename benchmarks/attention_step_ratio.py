"""Step time of GRPO with the attention_credit probe against plain GRPO, as a ratio within one process.

    nice -n 5 python benchmarks/attention_step_ratio.py --steps 20 --strategies coupled flow

One Trainer on the quickstart recipe (evaluation and checkpoints off, one thread) runs train steps
alternating between variants: plain GRPO (no probe), then each strategy (the probe switched on in the
scorer). The order rotates every round, so slow drift of a shared machine's load hits every variant
alike. Each step is timed in wall seconds and in process CPU seconds (`time.process_time`, which a
busy machine disturbs less than the wall clock); the table gives medians and their ratios to plain
GRPO, plus the probe's own `perf/credit_s` (hooks + reduction to weights). All variants train the
same model in turn, which changes nothing a step costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/quickstart.yaml")
    p.add_argument("--steps", type=int, default=20, help="measured rounds (each runs every variant once)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    p.add_argument("--strategies", nargs="+", default=["coupled", "flow"])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from credo.config import load_recipe
    from credo.families.attention.probe import AttentionCreditProbe
    from credo.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix="credo-attn-ratio-"))
    r = load_recipe(args.recipe, [f"run.output_dir={out}", "run.eval_every=0", "run.save_every=0",
                                  "run.progress=false", "run.plot=false", f"run.threads={args.threads}",
                                  f"run.steps={(args.steps + args.warmup) * (1 + len(args.strategies))}"])
    trainer = Trainer(r)
    scorer = trainer.scorer
    if scorer.probes or scorer.needs_old_log_probs:
        sys.exit("the recipe must be a single on-policy pass without probes (the probe is added here)")
    probes = {s: AttentionCreditProbe(s, seed=r.run.seed) for s in args.strategies}
    names = ["grpo", *args.strategies]
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    credit = {n: [] for n in names}
    step = trainer.start_step
    try:
        for i in range(args.warmup + args.steps):
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                probe = probes.get(name)
                scorer.probes = scorer.update_probes = [probe] if probe else []
                scorer.recompute_probes = []
                step += 1
                w0, c0 = time.perf_counter(), time.process_time()
                row = trainer.train_step(step)
                w1, c1 = time.perf_counter(), time.process_time()
                if i >= args.warmup:
                    wall[name].append(w1 - w0)
                    cpu[name].append(c1 - c0)
                    credit[name].append(row.get("perf/credit_s", 0.0))
    finally:
        trainer.close()
    base_w, base_c = statistics.median(wall["grpo"]), statistics.median(cpu["grpo"])
    print(f"{args.recipe}, {args.steps} rounds, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}")
    print("| variant | median step wall (s) | vs grpo | median step CPU (s) | vs grpo | perf/credit_s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {w:.4f} | {w / base_w:.2f}x | {c:.4f} | {c / base_c:.2f}x | "
              f"{statistics.median(credit[name]):.4f} |")


if __name__ == "__main__":
    main()
