"""Does z steer the strategy? Reasoning Palette's warm-up on `add_two_ways`, sampled under chosen latents.

    nice -n 5 python benchmarks/palette_steering.py [--recipe recipes/palette.yaml] [--n 100] [key=value ...]

Runs (or reuses from CREDO_CACHE) credo's SFT warm-up and the palette warm-up of the recipe with the overrides,
then samples `--n` held-out prompts (the task's first eval problems) at temperature `--temperature` (1) under:

    prior       z ~ N(0, I), one draw per prompt
    zero        z = 0 (the prior's mean)
    mu_columns  z = the mean posterior mean mu(x, y) of `--demos` training demonstrations in the columns strategy
    mu_tens     the same over tens-first demonstrations
    like_columns, like_tens   z = mu(x, y) of one example, 12+34= answered in each strategy (what `credo palette
                --like ANSWER --like-prompt 12+34=` uses)
    sweep t     z = midpoint + t * (mu_columns - mu_tens) / 2 for each t in --sweep (t = 1: mu_columns, -1: mu_tens)

and prints, for each, the share of completions in each strategy (`task.strategy`: columns, tens_first, other) and
the accuracy (the task's verifier). The warm-up's last-batch KL and log-likelihood (palette.json) are printed too,
with the two mean latents (for `credo palette FOLDER --z ...`). `--folder` measures a palette warm-up folder or a
run folder as it is (no warm-up; a run's policy after RL, its VAE from the newest checkpoint).
`--json PATH` writes the table as JSON lines. Sampling is seeded (`--seed`), so a cached warm-up gives the same
table every time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def warm_up(recipe: str, overrides: list[str]):
    """(palette warm-up folder, task, recipe): credo's SFT warm-up and the palette warm-up, both cached."""
    from credo.config import load_recipe
    from credo.families.palette.warmup import run_warmup
    from credo.family import families_of
    from credo.tasks import make_task
    from credo.train.setup import prepare_policy

    r = load_recipe(recipe, overrides)
    task = make_task(r.task, families_of(r))
    base, _ = prepare_policy(r, task, 0, 1)
    folder, _ = run_warmup(r, base, task, log=lambda m: print(m, file=sys.stderr, flush=True))
    return folder, task, r


@torch.no_grad()
def strategy_means(model, tok, vae, task, r, n_demos: int) -> dict[str, torch.Tensor]:
    """The mean posterior mean mu(x, y) over the first `n_demos` training demonstrations of each strategy, with the
    encoder's input as the warm-up computes it (palette.encoder_input)."""
    from credo.families.palette.vae import encoder_input
    from credo.families.palette.warmup import demo_batch
    from credo.tasks.render import prompt_renderer

    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)
    by: dict[str, list] = {"columns": [], "tens_first": []}
    i = 0
    while min(len(v) for v in by.values()) < n_demos and i < len(task):
        p = task.train(i)
        if len(by[p.meta["strategy"]]) < n_demos:
            by[p.meta["strategy"]].append(p)
        i += 1
    out = {}
    for how, problems in by.items():
        ids, attn, answer = demo_batch(tok, render, problems)
        mu, _ = vae.encode(encoder_input(model, ids, attn, answer, r.palette.encoder_input))
        out[how] = mu.mean(0)
    return out


def measure(model, tok, vae, task, prompts, z: torch.Tensor, *, temperature: float, seed: int, max_new: int) -> dict:
    from credo.families.palette.steer import generate_with_z

    texts = generate_with_z(model, tok, vae, [p.prompt for p in prompts], z, max_new_tokens=max_new,
                            temperature=temperature, seed=seed)
    kinds = [task.strategy(t) for t in texts]
    n = len(texts)
    return {"columns": kinds.count("columns") / n, "tens_first": kinds.count("tens_first") / n,
            "other": kinds.count("other") / n, "accuracy": sum(task.score(t, p) for t, p in zip(texts, prompts)) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes" / "palette.yaml"))
    ap.add_argument("--n", type=int, default=100, help="held-out prompts")
    ap.add_argument("--demos", type=int, default=200, help="training demonstrations per strategy for mu")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default="", help="comma-separated t values along the strategy direction")
    ap.add_argument("--json", default=None)
    ap.add_argument("--folder", default=None, help="measure this warm-up or run folder (the recipe still gives the "
                    "task and the sampling settings)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    torch.set_num_threads(int(os.environ.get("CREDO_THREADS", "1")))

    from credo.families.palette.steer import load_steerable

    t0 = time.time()
    if args.folder:
        from credo.config import load_recipe
        from credo.family import families_of
        from credo.tasks import make_task

        r = load_recipe(args.recipe, args.overrides)
        folder, task = args.folder, make_task(r.task, families_of(r))
    else:
        folder, task, r = warm_up(args.recipe, args.overrides)
    model, tok, vae = load_steerable(folder)
    info_file = Path(folder) / "palette.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {"vae_stage": {}, "sft_stage": {}}
    prompts = task.eval_problems()[:args.n]
    mus = strategy_means(model, tok, vae, task, r, args.demos)
    n = len(prompts)
    zs = {"prior": torch.randn(n, vae.latent_dim, generator=torch.Generator().manual_seed(args.seed + 1)),
          "zero": torch.zeros(n, vae.latent_dim),
          "mu_columns": mus["columns"].expand(n, -1), "mu_tens": mus["tens_first"].expand(n, -1)}
    from credo.families.palette.steer import posterior_mean
    from credo.families.palette.task import columns_answer, tens_first_answer

    for name, answer in (("like_columns", columns_answer(12, 34, 2)), ("like_tens", tens_first_answer(12, 34, 2))):
        zs[name] = posterior_mean(model, tok, vae, "12+34=", answer).expand(n, -1)
    mid, half = (mus["columns"] + mus["tens_first"]) / 2, (mus["columns"] - mus["tens_first"]) / 2
    for t in [float(x) for x in args.sweep.split(",") if x.strip()]:
        zs[f"sweep {t:+g}"] = (mid + t * half).expand(n, -1)
    rows = []
    for name, z in zs.items():
        m = measure(model, tok, vae, task, prompts, z, temperature=args.temperature, seed=args.seed,
                    max_new=r.rollout.max_new_tokens)
        rows.append({"z": name, **m})
    head = {"folder": folder, "overrides": args.overrides, "n": n, "temperature": args.temperature,
            "kl": [info["vae_stage"].get("kl"), info["sft_stage"].get("kl")],
            "recon": [info["vae_stage"].get("recon"), info["sft_stage"].get("recon")],
            "mu_gap": float((mus["columns"] - mus["tens_first"]).norm()), "seconds": round(time.time() - t0, 1),
            "mu_columns": [round(x, 3) for x in mus["columns"].tolist()],
            "mu_tens": [round(x, 3) for x in mus["tens_first"].tolist()]}
    print(json.dumps(head))
    print(f"{'z':<14} {'columns':>8} {'tens_first':>10} {'other':>6} {'accuracy':>8}")
    for row in rows:
        print(f"{row['z']:<14} {row['columns']:>8.0%} {row['tens_first']:>10.0%} {row['other']:>6.0%} "
              f"{row['accuracy']:>8.0%}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({**head, "rows": rows}) + "\n")


if __name__ == "__main__":
    main()
