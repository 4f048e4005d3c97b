"""The policy's entropy of the critics sweep, compared across variants whose loggers name it differently.

With AsyPPO's entropy filter on (`critic.high_frac > 0`) `train/entropy` is the bonus term, with the filtered
tokens counted as 0, and the policy's entropy over all loss tokens is `train/entropy_unfiltered`; without the
filter `train/entropy` is the policy's entropy and the other key is not logged. So no single `credo report`
column compares them; this script takes, per run, the last-10-step mean of whichever key is the policy's
entropy (from the sweep's results file) and tests each variant against a baseline with the same statistics as
`credo report` (its `compare`: paired by seed where the runs of a seed share a warm-up, else Welch; Holm over
the table).

    python benchmarks/critics_entropy.py docs/results/critics.jsonl --baseline asyppo
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from credo.ablate.report import VariantResult, compare
from credo.ablate.stats import holm, mean_ci

KEYS = ("train/entropy_unfiltered last-10 mean", "train/entropy last-10 mean")
LABEL = "policy entropy"


def policy_entropy(row: dict) -> float:
    """The run's policy entropy: the unfiltered key where the filter logged it, else `train/entropy`."""
    values = row["values"]
    return values[KEYS[0]] if values.get(KEYS[0]) is not None else values[KEYS[1]]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="the sweep's results file (docs/results/critics.jsonl)")
    ap.add_argument("--baseline", default="asyppo", help="the variant every other one is compared with")
    args = ap.parse_args(argv)
    rows = defaultdict(list)
    for line in open(args.results):
        row = json.loads(line)
        rows[row["variant"]].append(row)
    variants = {}
    for name, recs in rows.items():  # credo report's per-variant record, with the one-name entropy as its metric
        values = {r["seed"]: policy_entropy(r) for r in recs}
        variants[name] = VariantResult(variant=name, n=len(recs), seeds=list(values), values={LABEL: values},
                                       stats={LABEL: mean_ci(list(values.values()))},
                                       warmups={r["seed"]: r.get("warmup_key") for r in recs})
    base = variants[args.baseline]
    compared = [compare(v, base, LABEL) for name, v in variants.items() if name != args.baseline]
    m = base.stats[LABEL]
    print(f"policy entropy, last 10 steps; baseline {args.baseline}: {m.mean:.4f} [{m.low:.4f}, {m.high:.4f}]")
    print("| variant | Δ [95% CI] | test | p | p (Holm) | effect size [95% CI] |")
    print("|---|---|---|---|---|---|")
    for c, p_adj in zip(compared, holm([c.p for c in compared])):
        print(f"| {c.a} | {c.diff:+.4f} [{c.low:+.4f}, {c.high:+.4f}] | {c.test} | {c.p:.3f} | {p_adj:.3f} | "
              f"{c.g.kind} {c.g.g:+.1f} [{c.g.low:+.1f}, {c.g.high:+.1f}] |")


if __name__ == "__main__":
    main()
