"""P-GenRM test-time scaling over seeds: per-user accuracy without scaling, Ind-N, Ind-N + Pro-M (arXiv 2602.12116).

    python benchmarks/pgenrm_scaling.py --seeds 0 1 2 3 4 --out-dir runs/pgenrm [recipe overrides ...]

Each seed s warms up `recipes/pgenrm.yaml run.seed=s sft.seed=s` in this process (PSI, the `sft:` section,
cached) and runs `credo.families.judges.pgenrm.scaling.run_scaling` on it with sampling seed s (key "sft"); with
`--model final` it first trains the whole recipe (PSI then CRE GRPO) and evaluates the run's final/ too (key
"final"). It keeps the JSON as seed<s>.json (a seed whose JSON exists is not rerun). Then table.md: per
setting the mean over seeds of per-user accuracy with its 95% Student-t interval, and the paired per-seed
differences Ind-N - none, Ind-N+Pro-M - none, Ind-N+Pro-M - Ind-N and Ind-N+Pro-M - Ind-(N+M) (the
equal-budget control); and pgenrm_scaling.png.

It also writes the raw per-seed results that `credo report` reads (`--results`, default
docs/results/pgenrm_scaling.jsonl; `--results ''` writes none): one line per (setting, seed) of sweep
`pgenrm_scaling` (`pgenrm_records`), variants the settings none, ind (Ind-N), ind_more (Ind-(N+M)), ind_pro
(Ind-N + Pro-M) and pro (Pro-M alone), with the metrics pgenrm/per_user_accuracy, pgenrm/per_pair_accuracy and
pgenrm/determined_accuracy / pgenrm/open_accuracy (per pair, on the pairs whose shots pin the user's rule / leave
it open); the none line also holds the seed's diagnostics pgenrm/determined_frac, pgenrm/neighbour_same_rule,
pgenrm/prototype_purity, pgenrm/chains_per_s and pgenrm/unparseable_{greedy,self,neighbour}. With `--model final`
the same metrics of the trained run's final/ follow as pgenrm/final/<metric>. The settings of one seed share its
warmup_key, so the report pairs them by seed (a rerun replaces its own lines; other lines are kept):

    credo report docs/results/pgenrm_scaling.jsonl --metric pgenrm/per_user_accuracy --baseline none \\
        --variants none ind ind_more ind_pro --compare 'ind_pro vs ind' --compare 'ind_pro vs ind_more'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMES = {"none": "no scaling (greedy)", "ind": "Ind-N", "ind_pro": "Ind-N + Pro-M", "ind_more": "Ind-(N+M)",
         "pro": "Pro-M alone"}
SWEEP = "pgenrm_scaling"


def seed_diagnostics(r: dict) -> dict[str, float]:
    """Numbers of one evaluation that no setting owns (they go on the line of `none` only)."""
    return {"determined_frac": r["by_shots"]["determined_frac"], "neighbour_same_rule": r["neighbour_same_rule"],
            "prototype_purity": r["prototype_purity"], "chains_per_s": r["chains_per_s"],
            **{f"unparseable_{k}": r["unparseable"][k] for k in ("greedy", "self", "neighbour")}}


def setting_metrics(r: dict, setting: str) -> dict[str, float]:
    """{metric: value} of one setting in one evaluation (`run_scaling`'s dict); a subset with no pair is left out."""
    out = {"per_user_accuracy": r["per_user"][setting], "per_pair_accuracy": r["per_pair"][setting]}
    for part in ("determined", "open"):
        if r["by_shots"][part][setting] is not None:
            out[f"{part}_accuracy"] = r["by_shots"][part][setting]
    return out | (seed_diagnostics(r) if setting == "none" else {})


def seed_overrides(overrides: list[str], seed: int) -> list[str]:
    """A seed's overrides (its run folder, which says nothing of its numbers, is added by `main`)."""
    return [*overrides, f"run.seed={seed}", f"sft.seed={seed}"]


def config_hash(recipe: str, overrides: list[str], settings: dict) -> str:
    """Hash of what a seed's evaluation is made of: the recipe (path relative to the repository when inside it),
    the seed's overrides and the scaling settings (n, m, k, embed, model)."""
    path = Path(recipe).resolve()
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    text = json.dumps({"recipe": name, "overrides": list(overrides), **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pgenrm_records(results: dict, seeds: list[int], *, recipe: str, overrides: list[str], settings: dict,
                   commit: str, host: dict, date: str) -> list[dict]:
    """The `credo report` lines (schema of credo.ablate.results) of every (setting, seed): results is seed -> the
    seed's JSON ({"sft": run_scaling's dict, "final": the same for the trained run (--model final), "wall_s"})."""
    out = []
    for s in seeds:
        res = results[s]
        for setting in NAMES:
            final = {f"pgenrm/{k}": v for k, v in setting_metrics(res["sft"], setting).items()}
            if "final" in res:
                final |= {f"pgenrm/final/{k}": v for k, v in setting_metrics(res["final"], setting).items()}
            out.append({
                "schema": 1, "sweep": SWEEP, "variant": setting, "seed": s, "sft_seed": s,
                "warmup_key": f"{SWEEP}/seed{s}", "warmup_sha256": None,
                "config_hash": config_hash(recipe, seed_overrides(overrides, s), settings),
                "overrides": list(overrides), "commit": commit, "date": date, "host": host,
                "wall_s": res.get("wall_s") if setting == next(iter(NAMES)) else None,  # the seed's one process, counted once
                "steps": None, "final": final,
                "curves": {k: {"0": v} for k, v in final.items()}, "values": {},
            })
    return out


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
    ap.add_argument("--results", default="docs/results/pgenrm_scaling.jsonl",
                    help="the results file `credo report` reads (one line per setting and seed; '' for none)")
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
            recipe = load_recipe(args.recipe, [*seed_overrides(args.overrides, s),
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
    if args.results:
        from credo.ablate.results import git_commit, host_fingerprint, upsert_results

        settings = {"n": args.n, "m": args.m, "k": args.k, "embed": args.embed, "model": args.model}
        upsert_results(args.results, pgenrm_records(
            results, args.seeds, recipe=args.recipe, overrides=args.overrides, settings=settings,
            commit=git_commit(REPO), host=host_fingerprint(threads=torch.get_num_threads()),
            date=time.strftime("%Y-%m-%dT%H:%M:%S")))
        print(f"results: {args.results} ({len(args.seeds) * len(NAMES)} lines of sweep {SWEEP})")


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
