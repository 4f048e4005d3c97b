"""P-GenRM test-time scaling over seeds: per-user accuracy without scaling, Ind-N, Ind-N + Pro-M (arXiv 2602.12116).

    python benchmarks/pgenrm_scaling.py --seeds 0 1 2 3 4 --out-dir runs/pgenrm [recipe overrides ...]

Each seed s warms up `recipes/pgenrm.yaml run.seed=s sft.seed=s` in this process (PSI, the `sft:` section,
cached) and runs `credo.families.judges.pgenrm.scaling.run_scaling` on it with sampling seed s (key "sft"); with
`--model final` it first trains the whole recipe (PSI then CRE GRPO) and evaluates the run's final/ too (key
"final"). It keeps the JSON as seed<s>.json (a seed whose JSON exists is not rerun). Then table.md: per
setting the mean over seeds of per-user accuracy with its 95% Student-t interval, and the paired per-seed
differences Ind-N - none, Ind-N+Pro-M - none, Ind-N+Pro-M - Ind-N and Ind-N+Pro-M - Ind-(N+M) (the
equal-budget control); and pgenrm_scaling.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMES = {"none": "no scaling (greedy)", "ind": "Ind-N", "ind_pro": "Ind-N + Pro-M", "ind_more": "Ind-(N+M)",
         "pro": "Pro-M alone"}


def fmt(ci) -> str:
    return f"{ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def evaluate(path: str, recipe, args, seed: int) -> dict:
    from credo.families.judges.pgenrm.scaling import load_judge_model, run_scaling
    from credo.tasks import make_task

    backend, tok = load_judge_model(path)
    return run_scaling(backend, tok, make_task(recipe.task), n_self=args.n, m_nb=args.m, k_protos=args.k,
                       embed=args.embed, seed=seed, max_new_tokens=recipe.rollout.max_new_tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "pgenrm.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--n", type=int, default=8, help="Ind-N: own chains per pair")
    ap.add_argument("--m", type=int, default=4, help="Pro-M: neighbours per pair")
    ap.add_argument("--k", type=int, default=8, help="prototypes (k-means over the training users)")
    ap.add_argument("--embed", default="history", choices=["history", "persona"])
    ap.add_argument("--model", default="sft", choices=["sft", "final"],
                    help="sft: the PSI warm-up alone (no GRPO); final: train the whole recipe (PSI then CRE) and "
                         "evaluate its final/ (and the warm-up too)")
    ap.add_argument("--out-dir", default="runs/pgenrm")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    import torch

    from credo.ablate.stats import mean_ci
    from credo.cli import _quiet_libraries
    from credo.config import load_recipe
    from credo.models import resolve_model_path
    from credo.tasks import make_task
    from credo.sft import run_sft
    from credo.trainer import train

    torch.set_num_threads(1)
    _quiet_libraries()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for s in args.seeds:
        f = out / f"seed{s}.json"
        if not f.exists():
            t0 = time.time()
            recipe = load_recipe(args.recipe, [*args.overrides, f"run.seed={s}", f"sft.seed={s}",
                                               f"run.output_dir={out / f'seed{s}'}"])
            res = {}
            if args.model == "final":
                res["final"] = evaluate(str(train(recipe) / "final"), recipe, args, s)
            base = resolve_model_path(recipe.model.path, recipe.model.tiny)
            sft_path, _ = run_sft(recipe, base, make_task(recipe.task), log=lambda m: None)  # cached by `train`
            res["train_s"] = round(time.time() - t0, 1)
            res["sft"] = evaluate(sft_path, recipe, args, s)
            res["wall_s"] = round(time.time() - t0, 1)
            f.write_text(json.dumps(res))
            print(f"seed {s}: {res['sft']['per_user']} ({res['wall_s']} s)", flush=True)
        results[s] = json.loads(f.read_text())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for model in ("sft", "final"):
        if not all(model in results[s] for s in args.seeds):
            continue
        col = {k: [results[s][model]["per_user"][k] for s in args.seeds] for k in NAMES}
        diff = lambda a, b: [x - y for x, y in zip(col[a], col[b])]  # noqa: E731 - paired: same pairs per seed
        r0 = results[args.seeds[0]][model]
        rows += [f"### {model} (N = {r0['n_self']}, M = {r0['m_nb']}, k = {r0['k_protos']}, embed {r0['embed']})", "",
                 "| setting | per-user accuracy |", "|---|---|"]
        rows += [f"| {NAMES[k]} | {fmt(mean_ci(v))} |" for k, v in col.items()]
        rows += [f"| Ind-N - none | {fmt(mean_ci(diff('ind', 'none')))} |",
                 f"| Ind-N+Pro-M - none | {fmt(mean_ci(diff('ind_pro', 'none')))} |",
                 f"| Ind-N+Pro-M - Ind-N | {fmt(mean_ci(diff('ind_pro', 'ind')))} |",
                 f"| Ind-N+Pro-M - Ind-(N+M) | {fmt(mean_ci(diff('ind_pro', 'ind_more')))} |", ""]
        for part in ("determined", "open"):
            cells = ", ".join(f"{NAMES[k]} {fmt(mean_ci([results[s][model]['by_shots'][part][k] for s in args.seeds]))}"
                              for k in ("none", "ind", "ind_pro"))
            rows.append(f"- per pair, shots {part}: {cells}")
        get = lambda key: mean_ci([results[s][model][key] for s in args.seeds])  # noqa: E731
        rows += [f"- shots pin the rule on {results[args.seeds[0]][model]['by_shots']['determined_frac']:.3f} of pairs;"
                 f" neighbours share the user's rule {fmt(get('neighbour_same_rule'))}; prototype purity "
                 f"{fmt(get('prototype_purity'))}; chains/s {fmt(get('chains_per_s'))}; unparseable greedy "
                 f"{fmt(mean_ci([results[s][model]['unparseable']['greedy'] for s in args.seeds]))}", ""]
    rows.append(f"seeds {args.seeds}; wall s per seed {[results[s].get('wall_s') for s in args.seeds]}; "
                f"commit {commit}; overrides {args.overrides}")
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    plot(results, args, out / "pgenrm_scaling.png")


def plot(results: dict, args, path: Path) -> None:
    """Per-user accuracy of each setting: seeds as dots, mean with its 95% Student-t interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from credo.ablate.stats import mean_ci

    keys = ["none", "ind", "ind_more", "ind_pro"]
    model = "final" if all("final" in results[s] for s in args.seeds) else "sft"
    r0 = results[args.seeds[0]][model]
    labels = ["none", f"Ind-{r0['n_self']}", f"Ind-{r0['n_self'] + r0['m_nb']}",
              f"Ind-{r0['n_self']}+Pro-{r0['m_nb']}"]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, k in enumerate(keys):
        v = [results[s][model]["per_user"][k] for s in args.seeds]
        ci = mean_ci(v)
        ax.scatter([i + 0.15] * len(v), v, s=12, color="grey", alpha=0.6)
        ax.errorbar([i], [ci.mean], yerr=[[ci.mean - ci.low], [ci.high - ci.mean]], marker="o", capsize=4, color="C0")
    ax.set_xticks(range(len(keys)), labels)
    ax.set_ylabel("per-user preference accuracy")
    ax.set_title(f"P-GenRM test-time scaling, tiny judge ({'PSI' if model == 'sft' else 'PSI+CRE'}), "
                 f"{len(args.seeds)} seeds, 95% CI", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
