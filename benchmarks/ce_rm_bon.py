"""CE-RM best-of-N over seeds: judge pick vs random pick vs verifier pick, 95% Student-t intervals (docs/judges.md).

    python benchmarks/ce_rm_bon.py --seeds 0 1 2 3 4 --out-dir runs/bon [recipe overrides ...]

Each seed s runs `credo bon recipes/ce_rm_bon.yaml run.seed=s judge.warmup_seed=s --n 1 4 16` in this process
(seed = the judge warm-up's data order, the policy's sampling and the tie-breaks; the policy's warm-up and both
initialisations are shared) and keeps its JSON as seed<s>.json; a seed whose JSON exists is not rerun. Then
table.md: per N the mean and interval of each pick's accuracy, and of the paired per-seed differences
judge - random, judge - well-formed random and oracle - random. "Well-formed random" picks uniformly among the
samples that are digits only (no stray '.'; all samples when none is): what a format check alone achieves, so
judge - well-formed random is the part of the lift that needs the arithmetic judged. Also the judge's turn-1
criteria accuracy (criteria == "=" + the right answer) and its label accuracy (score > 5 iff right).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def well_formed_random(responses, correct, n: int) -> float:
    acc = 0.0
    for rs, ok in zip(responses, correct):
        keep = [v for r, v in zip(rs[:n], ok[:n]) if r.strip().isdigit()] or ok[:n]
        acc += sum(keep) / len(keep)
    return acc / len(responses)


def fmt(ci) -> str:
    return f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "ce_rm_bon.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--out-dir", default="runs/bon")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from credo.ablate.stats import mean_ci
    from credo.cli import _quiet_libraries
    from credo.config import load_recipe
    from credo.families.judges.best_of_n import run_best_of_n
    from credo.tasks import make_task

    _quiet_libraries()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for s in args.seeds:
        f = out / f"seed{s}.json"
        if not f.exists():
            t0 = time.time()
            recipe = load_recipe(args.recipe, [*args.overrides, f"run.seed={s}", f"judge.warmup_seed={s}"])
            res = run_best_of_n(recipe, args.n, log=lambda m: None)
            res["wall_s"] = round(time.time() - t0, 1)
            f.write_text(json.dumps(res))
            print(f"seed {s}: {res['table']} ({res['wall_s']} s)", flush=True)
        results[s] = json.loads(f.read_text())
    problems = make_task(load_recipe(args.recipe, args.overrides).task).eval_problems()
    rows = ["| N | judge pick | random pick | well-formed random | verifier pick (pass@N) | judge - random | "
            "judge - well-formed random | verifier - random |", "|---|---|---|---|---|---|---|---|"]
    for n in args.n:
        col = {k: [results[s]["table"][str(n)][k] for s in args.seeds] for k in ("judge", "random", "oracle")}
        wf = [well_formed_random(results[s]["responses"], results[s]["correct"], n) for s in args.seeds]
        diff = lambda a, b: [x - y for x, y in zip(a, b)]  # noqa: E731 - paired: the same samples per seed
        rows.append(f"| {n} | {fmt(mean_ci(col['judge']))} | {fmt(mean_ci(col['random']))} | {fmt(mean_ci(wf))} | "
                    f"{fmt(mean_ci(col['oracle']))} | {fmt(mean_ci(diff(col['judge'], col['random'])))} | "
                    f"{fmt(mean_ci(diff(col['judge'], wf)))} | {fmt(mean_ci(diff(col['oracle'], col['random'])))} |")
    crit = [sum(c == "=" + p.answer for c, p in zip(results[s]["criteria"], problems)) / len(problems)
            for s in args.seeds]
    label = [results[s]["judge_label_accuracy"] for s in args.seeds]
    bad = [results[s]["unparseable_frac"] for s in args.seeds]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows += ["", f"seeds {args.seeds}; judge criteria accuracy {fmt(mean_ci(crit))}; judge label accuracy "
             f"{fmt(mean_ci(label))}; unparseable {fmt(mean_ci(bad))}; wall s per seed "
             f"{[results[s].get('wall_s') for s in args.seeds]}; commit {commit}; overrides {args.overrides}"]
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    plot(results, args, out / "bon.png")


def plot(results: dict, args, path: Path) -> None:
    """Accuracy of each pick against N, mean over seeds with its 95% Student-t interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from credo.ablate.stats import mean_ci

    picks = {"judge pick": lambda r, n: r["table"][str(n)]["judge"],
             "random pick": lambda r, n: r["table"][str(n)]["random"],
             "well-formed random": lambda r, n: well_formed_random(r["responses"], r["correct"], n),
             "verifier pick (pass@N)": lambda r, n: r["table"][str(n)]["oracle"]}
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (name, get) in enumerate(picks.items()):
        cis = [mean_ci([get(results[s], n) for s in args.seeds]) for n in args.n]
        x = [n * (1 + 0.04 * (i - 1.5)) for n in args.n]  # a small offset so the error bars do not overlap
        ax.errorbar(x, [c.mean for c in cis], yerr=[[c.mean - c.low for c in cis], [c.high - c.mean for c in cis]],
                    marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(args.n, [str(n) for n in args.n])
    ax.set_xlabel("N (samples per problem)")
    ax.set_ylabel("verifier accuracy of the pick")
    ax.set_title(f"CE-RM best-of-N, {len(args.seeds)} seeds, 95% CI", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
