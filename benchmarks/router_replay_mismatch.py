"""Router replay measured paired (docs/moe.md): one model, the same sampled batches, pi_old with and without replay.

A bf16 rollout copy of the model (the hf backend, `rollout.dtype: bfloat16`) samples `--batches` batches of the
quickstart task's prompts with routing capture; the fp32 trainer's pi_old forward scores each batch twice, routing
itself and replaying the record, and the `mismatch/*` metrics (mu against pi_old on the response tokens) and the
`moe/*` disagreement are computed for both on the same tokens; then again on the "affected" samples only, those with
at least one (position, layer) whose trainer routing differs from the record (the rest score alike both ways).

    python benchmarks/router_replay_mismatch.py MODEL_DIR [--batches 8] [--prompts 64] [--group 8]

MODEL_DIR: a saved MoE policy, e.g. a run of recipes/moe.yaml's final/ or checkpoints/step_N folder (the warm-up
alone: its cached folder). Prints a Markdown table.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from credo.algos.mismatch import mismatch_metrics
    from credo.config import load_recipe
    from credo.distributed.rollout import HFBackend
    from credo.models import load_causal_lm, load_tokenizer
    from credo.tasks import make_task
    from credo.tasks.render import encode_prompts, plain_prompt
    from credo.train.batch import Batch, pack_batch
    from credo.train.mismatch import routing_metrics
    from credo.train.scoring import PolicyScorer

    r = load_recipe("recipes/moe.yaml")
    model, tok = load_causal_lm(a.model), load_tokenizer(a.model)
    backend = HFBackend(model, tok, dtype="bfloat16")
    task = make_task(r.task)
    from credo import moe

    totals = {(False, "all"): [], (True, "all"): [], (False, "affected"): [], (True, "affected"): []}
    for b in range(a.batches):
        problems = [task.train(b * a.prompts + i) for i in range(a.prompts)]
        prompts = [p for p in encode_prompts(tok, plain_prompt, problems) for _ in range(a.group)]
        samples = backend.generate(prompts, max_new_tokens=r.rollout.max_new_tokens, temperature=1.0, top_p=1.0,
                                   seeds=[b * 100_000 + i for i in range(len(prompts))], routing=True)
        affected = None
        for replay in (False, True):
            batch = Batch(samples=samples, problems=[None] * len(samples), group_ids=torch.arange(len(samples)))
            batch.valid = torch.ones(len(samples), dtype=torch.bool)
            pack_batch(batch, tok.pad_token_id, overlong_filter=False)
            if affected is None:  # the trainer's own routing on the padded batch, against the record
                with moe.RoutingRecorder(model) as rec, torch.no_grad():
                    model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                own = rec.per_position(len(samples))[:, :-1].long()
                recorded = batch.routed_experts.long()
                differs = (own.sort(-1).values != recorded.sort(-1).values).any(-1).any(-1) & (recorded[..., 0, 0] >= 0)
                affected = differs.any(-1)
            scorer = PolicyScorer(temperature=1.0, chunk_size=1024, hidden_path=True, needs_old_log_probs=True,
                                  router_replay=replay)
            scorer.recompute(model, batch)
            m = mismatch_metrics(batch.old_log_probs.double(), batch.rollout_log_probs.double(), batch.loss_mask)
            m.update(routing_metrics(batch))
            m["samples"] = len(samples)
            totals[(replay, "all")].append(m)
            if affected.any():
                sub = mismatch_metrics(batch.old_log_probs[affected].double(),
                                       batch.rollout_log_probs[affected].double(), batch.loss_mask[affected])
                sub.update({k: m[k] for k in ("moe/routing_disagreement", "moe/router_disagreement")})
                sub["samples"] = int(affected.sum())
                totals[(replay, "affected")].append(sub)
    keys = ["moe/routing_disagreement", "moe/router_disagreement", "mismatch/k3", "mismatch/log_ratio_p1",
            "mismatch/log_ratio_p99", "mismatch/max_ratio", "mismatch/ess"]
    print(f"model {a.model}; {a.batches} batches of {a.prompts} x {a.group} samples; bf16 rollout copy, fp32 pi_old")
    print("| samples | replay | n | " + " | ".join(keys) + " |\n|" + " --- |" * (len(keys) + 3))
    for which in ("all", "affected"):
        for replay in (False, True):
            rows = totals[(replay, which)]
            if not rows:
                continue
            n = sum(m["samples"] for m in rows)  # token metrics: means over batches weighted by their samples
            means = [max(m[k] for m in rows) if k == "mismatch/max_ratio"
                     else sum(m[k] * m["samples"] for m in rows) / n for k in keys]
            print(f"| {which} | {'on' if replay else 'off'} | {n} | " + " | ".join(f"{v:.4g}" for v in means) + " |")


if __name__ == "__main__":
    main()
