"""The policy's entropy of the critics sweep, compared across variants whose loggers name it differently.

With AsyPPO's entropy filter on (`critic.high_frac > 0`) `train/entropy` is the bonus term, with the filtered
tokens counted as 0, and the policy's entropy over all loss tokens is `train/entropy_unfiltered`; without the
filter `train/entropy` is the policy's entropy and the other key is not logged. So no single `credo report`
column compares them; this script takes, per run, the last-10-step mean of whichever key is the policy's
entropy (from the sweep's results file) and tests each variant against a baseline with the same statistics as
`credo report` (paired by seed where the runs of a seed share a warm-up, else Welch; Holm over the table).

    python benchmarks/critics_entropy.py docs/results/critics.jsonl --baseline asyppo
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from credo.ablate.stats import hedges_g, holm, mean_ci, paired_diff, welch_diff

KEYS = ("train/entropy_unfiltered last-10 mean", "train/entropy last-10 mean")


def policy_entropy(row: dict) -> float:
    """The run's policy entropy: the unfiltered key where the filter logged it, else `train/entropy`."""
    values = row["values"]
    return values[KEYS[0]] if values.get(KEYS[0]) is not None else values[KEYS[1]]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="the sweep's results file (docs/results/critics.jsonl)")
    ap.add_argument("--baseline", default="asyppo", help="the variant every other one is compared with")
    args = ap.parse_args(argv)
    runs = defaultdict(dict)
    for line in open(args.results):
        row = json.loads(line)
        runs[row["variant"]][row["seed"]] = (policy_entropy(row), row.get("warmup_sha256"))
    base = runs[args.baseline]
    rows = []
    for name, seeds in runs.items():
        if name == args.baseline:
            continue
        common = sorted(set(seeds) & set(base))
        paired = bool(common) and all(seeds[s][1] and seeds[s][1] == base[s][1] for s in common)
        a, b = [seeds[s][0] for s in common], [base[s][0] for s in common]
        d = paired_diff(a, b) if paired else welch_diff([v for v, _ in seeds.values()], [v for v, _ in base.values()])
        rows.append((name, d, "paired" if paired else "Welch", hedges_g(a, b)))
    adjusted = holm([d.p for _, d, _, _ in rows])
    m = mean_ci([v for v, _ in base.values()])
    print(f"policy entropy, last 10 steps; baseline {args.baseline}: {m.mean:.4f} [{m.low:.4f}, {m.high:.4f}]")
    print("| variant | Δ [95% CI] | test | p | p (Holm) | Hedges' g [95% CI] |")
    print("|---|---|---|---|---|---|")
    for (name, d, test, g), p_adj in zip(rows, adjusted):
        print(f"| {name} | {d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}] | {test} | {d.p:.3f} | {p_adj:.3f} | "
              f"{g.g:+.1f} [{g.low:+.1f}, {g.high:+.1f}] |")


if __name__ == "__main__":
    main()
