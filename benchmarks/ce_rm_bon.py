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

It also writes the raw per-seed results that `credo report` reads (`--results`, default
docs/results/ce_rm_bon.jsonl; `--results ''` writes none): one line per (pick, seed) of sweep `ce_rm_bon`
(`bon_records`), variants judge, random, well_formed_random and verifier (pass@N), with the metrics
bon/accuracy_n{N} per N and the curve bon/accuracy (step = N); the judge's line also holds bon/criteria_accuracy,
bon/label_accuracy and bon/unparseable_frac. The picks of one seed share its warmup_key, so the report pairs
them by seed (a rerun replaces its own lines; lines of other seeds and sweeps in the file are kept). The tables
(the named comparison is on the first metric; --plot with --curves bon/accuracy draws accuracy against N):

    credo report docs/results/ce_rm_bon.jsonl --metric bon/accuracy_n16 --metric bon/accuracy_n4 \\
        --baseline random --compare 'judge vs well_formed_random'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = "ce_rm_bon"
PICKS = ("judge", "random", "well_formed_random", "verifier")
"""The variants of the results file: the judge's pick, a uniform pick (the samples' mean), a uniform pick among the
well-formed samples, the verifier's pick (pass@N)."""


def well_formed_random(responses, correct, n: int) -> float:
    acc = 0.0
    for rs, ok in zip(responses, correct):
        keep = [v for r, v in zip(rs[:n], ok[:n]) if r.strip().isdigit()] or ok[:n]
        acc += sum(keep) / len(keep)
    return acc / len(responses)


def criteria_accuracy(criteria: list[str], answers: list[str]) -> float:
    """Share of problems whose turn-1 criteria are exactly "=" + the right answer."""
    return sum(c == "=" + a for c, a in zip(criteria, answers)) / len(answers)


def pick_accuracy(res: dict, pick: str, n: int) -> float:
    """One seed's accuracy of `pick` (one of PICKS) at N = n, from the seed's JSON (`run_best_of_n`'s dict)."""
    if pick == "well_formed_random":
        return well_formed_random(res["responses"], res["correct"], n)
    return res["table"][str(n)]["oracle" if pick == "verifier" else pick]


def config_hash(recipe: str, overrides: list[str], ns: list[int]) -> str:
    """Hash of what a seed's run is made of: the recipe (path relative to the repository when inside it), the
    run's overrides (the seed's included) and the N list."""
    path = Path(recipe).resolve()
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    text = json.dumps({"recipe": name, "overrides": list(overrides), "n": list(ns)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def seed_overrides(overrides: list[str], seed: int) -> list[str]:
    return [*overrides, f"run.seed={seed}", f"judge.warmup_seed={seed}"]


def bon_records(results: dict, seeds: list[int], ns: list[int], *, answers: list[str], recipe: str,
                overrides: list[str], commit: str, host: dict, date: str) -> list[dict]:
    """The `credo report` lines (schema of credo.ablate.results) of every (pick, seed): results is seed -> the
    seed's JSON, answers the held-out problems' right answers (for the criteria accuracy)."""
    out = []
    for s in seeds:
        res = results[s]
        for pick in PICKS:
            acc = {n: pick_accuracy(res, pick, n) for n in ns}
            final = {f"bon/accuracy_n{n}": acc[n] for n in ns}
            if pick == "judge":
                final |= {"bon/criteria_accuracy": criteria_accuracy(res["criteria"], answers),
                          "bon/label_accuracy": res["judge_label_accuracy"],
                          "bon/unparseable_frac": res["unparseable_frac"]}
            curves = {k: {"0": v} for k, v in final.items()} | {"bon/accuracy": {str(n): acc[n] for n in ns}}
            out.append({
                "schema": 1, "sweep": SWEEP, "variant": pick, "seed": s, "sft_seed": s,
                "warmup_key": f"{SWEEP}/seed{s}", "warmup_sha256": None,
                "config_hash": config_hash(recipe, seed_overrides(overrides, s), ns), "overrides": list(overrides),
                "commit": commit, "date": date, "host": host,
                # one process made every pick of a seed: its wall time on the first line only, so a report's total
                # counts it once
                "wall_s": res.get("wall_s") if pick == PICKS[0] else None, "steps": None,
                "final": final, "curves": curves, "values": {},
            })
    return out


def fmt(ci) -> str:
    return f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "ce_rm_bon.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--out-dir", default="runs/bon")
    ap.add_argument("--results", default="docs/results/ce_rm_bon.jsonl",
                    help="the results file `credo report` reads (one line per pick and seed; '' for none)")
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
            recipe = load_recipe(args.recipe, seed_overrides(args.overrides, s))
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
    answers = [p.answer for p in problems]
    crit = [criteria_accuracy(results[s]["criteria"], answers) for s in args.seeds]
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
    if args.results:
        import torch

        from credo.ablate.results import git_commit, host_fingerprint, upsert_results

        upsert_results(args.results, bon_records(
            results, args.seeds, args.n, answers=answers, recipe=args.recipe, overrides=args.overrides,
            commit=git_commit(REPO), host=host_fingerprint(threads=torch.get_num_threads()),
            date=time.strftime("%Y-%m-%dT%H:%M:%S")))
        print(f"results: {args.results} ({len(args.seeds) * len(PICKS)} lines of sweep {SWEEP})")


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
