"""Peak memory and time of one policy update, padded against packed (`algo.packing`), at the same token budget.

The batch is a long-tail step: 16 problems of `longtail_add` (`recipes/longtail.yaml`'s task, 1-25 digits) x 4
responses, each response the problem's worked answer (12-252 tokens) cut at a seeded random point past half of
it, so lengths spread within a group as sampled ones do. The update is credo's own loss path, without DeepSpeed:
the micro-batches the Updater forms (`Updater.micro_batches`: `algo.micro_batch_size` sequences, or token-budget
groups, `credo.train.packing.token_micro_batches`), each scored by `PolicyScorer.update_forward` (padded, or packed
with `packed=True`) and `Objective` (PPO, token-mean), backward, gradients accumulated over the whole batch.

Memory is measured as in benchmarks/logprob_memory.py: each case runs in a fresh subprocess that builds the model
and the batch, runs one warm-up update, resets the kernel's peak-RSS counter (`/proc/self/clear_refs`), and
reports VmHWM minus the RSS before the measured update: the memory the update needed on top of the model, its
gradients and the batch. Time is the measured update's wall time (the minimum of `--repeats`).

    nice -n 10 .venv/bin/python benchmarks/packing_memory.py [--budgets 1024 2048 4096] [--model tiny wide]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

MODELS = {"tiny": {}, "wide": {"model.tiny.hidden_size": 512, "model.tiny.num_layers": 4, "model.tiny.num_heads": 8,
                               "model.tiny.num_kv_heads": 2, "model.tiny.intermediate_size": 1536}}
"""The long-tail recipe's tiny Qwen2 (hidden 128, 2 layers), and a wider one where activations weigh more."""


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def make_batch(tokenizer, seed: int = 0):
    """The long-tail batch (see the module docstring), packed by `credo.train.batch.pack_batch`."""
    import random

    import torch

    from credo.config import load_recipe
    from credo.distributed.rollout import Sample
    from credo.tasks import make_task
    from credo.tasks.render import encode_prompts, plain_prompt
    from credo.train.batch import Batch, pack_batch

    r = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "longtail.yaml")
    task = make_task(r.task)
    rng = random.Random(seed)
    problems = [task.train(rng.randrange(len(task))) for _ in range(16)]
    prompts = encode_prompts(tokenizer, plain_prompt, problems)
    samples = []
    for p, ids in zip(problems, prompts):
        answer = tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for _ in range(4):
            n = rng.randint(max(1, len(answer) // 2), len(answer))
            samples.append(Sample(list(ids), answer[:n], [1] * n, [-1.0] * n, n == len(answer)))
    batch = Batch(samples=samples, problems=[p for p in problems for _ in range(4)],
                  group_ids=torch.arange(16).repeat_interleave(4), step=1)
    g = torch.Generator().manual_seed(seed)
    batch.rewards, batch.valid = torch.rand(64, generator=g), torch.ones(64, dtype=torch.bool)
    pack_batch(batch, tokenizer.pad_token_id, overlong_filter=False)
    batch.advantages = torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask
    return batch


def case(model_name: str, packed: bool, budget: int, micro_batch_size: int, repeats: int) -> dict:
    """One measured update in this process (run by `main` in a subprocess per case)."""
    import torch

    from credo import algos
    from credo.config import load_recipe
    from credo.models import load_causal_lm, load_tokenizer, resolve_model_path
    from credo.train.objective import Objective
    from credo.train.scoring import PolicyScorer
    from credo.train.update import Updater

    torch.set_num_threads(1)
    r = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "longtail.yaml",
                    [f"{k}={v}" for k, v in MODELS[model_name].items()])
    path = resolve_model_path(r.model.path, r.model.tiny)
    tokenizer, model = load_tokenizer(path), load_causal_lm(path)
    batch = make_batch(tokenizer)
    scorer = PolicyScorer(temperature=1.0, chunk_size=1024, hidden_path=True, needs_old_log_probs=False,
                          packed=packed, micro_batch_tokens=budget)
    objective = Objective(algos.POLICY_LOSSES["ppo"], {}, agg_mode="token-mean", entropy_coef=0.0, kl_coef=0.0,
                          kl_estimator=None, norm_len=r.rollout.max_new_tokens)
    grad_accum = -(-len(batch) // micro_batch_size)
    micro = Updater(None, scorer, objective, ppo_epochs=1, mini_batches=1, grad_accum=grad_accum, zero_stage=0, world=1,
                    micro_batch_tokens=budget, packed=packed).micro_batches(batch, torch.arange(len(batch)))
    m = batch.loss_mask
    gt, gs = m.sum(), (m.sum(-1) > 0).sum()

    def update():
        model.zero_grad(set_to_none=False)
        for rows in micro:
            lp, ent = scorer.update_forward(model, batch, rows)
            loss, _, _ = objective(lp, ent, old_log_probs=lp.detach(), advantages=batch.advantages[rows], mask=m[rows],
                                   rollout_log_probs=batch.rollout_log_probs[rows], ref_log_probs=None, weights=None,
                                   global_tokens=gt, global_seqs=gs)
            loss.backward()

    update()  # warm-up: gradients allocated, kernels loaded
    times = []
    peak = 0
    for _ in range(repeats):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _rss_kib("VmRSS")
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
        peak = max(peak, _rss_kib("VmHWM") - base)
    real = int(batch.attention_mask.sum())
    return {"model": model_name, "packed": packed, "budget": budget, "micro_batch_size": micro_batch_size,
            "micro_batches": len(micro), "real_tokens": real,
            "padded_tokens": int(len(batch) * batch.attention_mask.shape[1]),
            "peak_mib": peak / 1024, "update_s": min(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", type=int, nargs="*", default=[1024, 2048, 4096])
    p.add_argument("--model", nargs="*", default=["tiny", "wide"], choices=sorted(MODELS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # internal: one case, JSON
    args = p.parse_args()
    if args.case:
        print(json.dumps(case(**json.loads(args.case), repeats=args.repeats)))
        return
    cases = [dict(model_name=m, packed=False, budget=0, micro_batch_size=64) for m in args.model]
    cases += [dict(model_name=m, packed=packed, budget=b, micro_batch_size=64)
              for m in args.model for b in args.budgets for packed in (False, True)]
    print("| model | layout | token budget | micro-batches | peak MiB (update) | update s |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        out = subprocess.run([sys.executable, __file__, "--case", json.dumps(c), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        res = json.loads(out)
        layout = "packed" if res["packed"] else "padded"
        budget = res["budget"] or f"none ({res['micro_batch_size']} sequences)"
        print(f"| {res['model']} | {layout} | {budget} | {res['micro_batches']} | {res['peak_mib']:.0f} | "
              f"{res['update_s']:.2f} |", flush=True)
    print(f"\nbatch: 64 samples, {res['real_tokens']} real tokens, {res['padded_tokens']} padded")


if __name__ == "__main__":
    main()
