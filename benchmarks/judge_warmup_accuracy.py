"""A judge's held-out accuracy after its warm-up, by candidate kind (docs/judges.md, "The judge after its warm-up").

    python benchmarks/judge_warmup_accuracy.py recipes/judge_reward.yaml [overrides] [--from-policy] [--show N]

Warms up (or reuses the cached warm-up of) the recipe's `judge:` section on `judge_arithmetic`, as `credo run`
does, then judges the task's 200 held-out items greedily and prints the accuracy per kind (ok, format, digit,
carry). --from-policy starts the judge from the policy's own warm-up (the recipe's `sft:`) instead of
`judge.path`; --show prints N judgements of digit and carry items.
"""

import argparse
import collections
import logging

from credo.config import ModelConfig, load_recipe
from credo.distributed.rollout import HFBackend
from credo.models import load_causal_lm, load_tokenizer, resolve_model_path
from credo.tasks import make_task
from credo.sft import run_sft
from credo.families.judges.reward import judge_warmup_recipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--from-policy", action="store_true")
    ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    rec = load_recipe(a.recipe, a.overrides)
    r = judge_warmup_recipe(rec.judge, rec.task)  # the warm-up `credo run` does
    j = rec.judge
    task = make_task(r.task)
    if a.from_policy:
        base, _ = run_sft(rec, resolve_model_path(rec.model.path, rec.model.tiny), make_task(rec.task), log=print)
        r.model = ModelConfig(path=base)
    else:
        base = resolve_model_path(j.path, j.tiny)
    path, _ = run_sft(r, base, task, log=print)
    tok = load_tokenizer(path)
    judge = HFBackend(load_causal_lm(path).eval(), tok)
    items = task.eval_problems()
    out = judge.generate([tok(p.prompt, add_special_tokens=False)["input_ids"] for p in items],
                         max_new_tokens=j.max_new_tokens, temperature=0, top_p=1.0, seeds=None)
    right, shown = collections.defaultdict(list), collections.Counter()
    for p, s in zip(items, out):
        text = tok.decode(s.response_ids, skip_special_tokens=True)
        ok = task.score(text, p)
        kind = p.meta["error"]
        right[kind].append(ok)
        right["all"].append(ok)
        if kind in ("digit", "carry") and shown[kind] < a.show:
            shown[kind] += 1
            print(f"{kind}: {p.prompt!r} -> {text!r} (target {p.answer!r})")
    print(f"judge {path}")
    for kind in ("ok", "format", "digit", "carry", "all"):
        print(f"  {kind:6s} {sum(right[kind]) / len(right[kind]):.3f} of {len(right[kind])}")


if __name__ == "__main__":
    main()
