"""Pool several `benchmarks/e2e_throughput.py` invocations: a variant's tokens/s against a baseline's over every
measured step of every run, and the per-round ratios with the 95% interval of their geometric mean.

    python benchmarks/e2e_pool.py docs/results/e2e_longtail_2026-12-05{b,c,d}.json \\
        --variant chunked_packed --baseline trl

Pooled tokens/s is total trained tokens over total seconds of the measured steps (steps x tokens per step over
steps x seconds per step, summed over the invocations). A round's ratio is the variant's run against the
baseline's run of the same round (the harness alternates them within a round); the interval is the t interval of
the mean log ratio, exponentiated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pooled_tokens_per_s(entries: list[dict]) -> float:
    """Total tokens over total seconds, from each invocation's steps, s_per_step and tokens_per_step."""
    tokens = sum(e["steps"] * e["tokens_per_step"] for e in entries)
    seconds = sum(e["steps"] * e["s_per_step"] for e in entries)
    return tokens / seconds


def round_ratios(summaries: list[dict], variant: str, baseline: str) -> list[float]:
    """One ratio per round: the variant's run tokens/s over the baseline's run of that round."""
    out = []
    for s in summaries:
        a, b = s["results"][variant]["run_tokens_per_s"], s["results"][baseline]["run_tokens_per_s"]
        if len(a) != len(b):
            raise ValueError(f"{variant} has {len(a)} runs and {baseline} {len(b)} in one summary: rounds do not pair")
        out += [x / y for x, y in zip(a, b)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summaries", nargs="+", help="summary.json files written by e2e_throughput.py")
    p.add_argument("--variant", required=True, help="the run compared, e.g. chunked_packed")
    p.add_argument("--baseline", default="trl", help="the run compared against (default trl)")
    args = p.parse_args()
    from credo.ablate.stats import mean_ci

    summaries = [json.loads(Path(f).read_text()) for f in args.summaries]
    for f, s in zip(args.summaries, summaries):
        for name in (args.variant, args.baseline):
            if name not in s["results"]:
                sys.exit(f"{f}: no run named {name!r} (it has {', '.join(s['results'])})")
    v = pooled_tokens_per_s([s["results"][args.variant] for s in summaries])
    b = pooled_tokens_per_s([s["results"][args.baseline] for s in summaries])
    ratios = round_ratios(summaries, args.variant, args.baseline)
    ci = mean_ci([math.log(r) for r in ratios])
    print(f"pooled over {len(summaries)} invocation(s): {args.variant} {v:.0f} tokens/s, {args.baseline} {b:.0f}: "
          f"{v / b:.2f}x")
    print(f"per-round ratios ({len(ratios)}): {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"geometric mean {math.exp(ci.mean):.2f}x, 95% CI [{math.exp(ci.low):.2f}, {math.exp(ci.high):.2f}]")


if __name__ == "__main__":
    main()
