"""What a judge-trained policy answers, and what the judge says to it (docs/reproductions.md, judge as the reward).

    python benchmarks/judge_hacking.py POLICY_DIR JUDGE_DIR [POLICY_DIR ...]

Samples 4 answers per held-out problem of recipes/judge_reward.yaml's task at temperature 1 (seeded), sorts them
into right / right + '.' / well-formed but wrong (units digit right or wrong) / other, and asks the frozen judge
(greedy, the recipe's template "{question}{response}?") for its verdict on each. The judge's folder is the one
its warm-up was cached in (a run's log names it: "judge sft: reusing cached warm-up ...").
"""

import argparse
import collections

from credo.config import load_recipe
from credo.distributed.rollout import HFBackend
from credo.models import load_causal_lm, load_tokenizer
from credo.families.judges.parse import parse_pointwise_score
from credo.tasks import make_task


def kind(text: str, answer: str) -> str:
    t = text.strip()
    if t == answer:
        return "right"
    if t == answer + ".":
        return "right + '.'"
    if len(t) == len(answer) and t.isdigit():
        return "wrong, units digit right" if t[-1] == answer[-1] else "wrong, units digit wrong"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("judge")
    ap.add_argument("policies", nargs="+")
    ap.add_argument("--recipe", default="recipes/judge_reward.yaml")
    ap.add_argument("--samples", type=int, default=4)
    a = ap.parse_args()
    rec = load_recipe(a.recipe)
    probs = make_task(rec.task).eval_problems()
    jt = load_tokenizer(a.judge)
    judge = HFBackend(load_causal_lm(a.judge).eval(), jt)
    for path in a.policies:
        tok = load_tokenizer(path)
        policy = HFBackend(load_causal_lm(path).eval(), tok)
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in probs for _ in range(a.samples)]
        out = policy.generate(prompts, max_new_tokens=rec.rollout.max_new_tokens, temperature=1.0, top_p=1.0,
                              seeds=list(range(len(prompts))))
        texts = tok.batch_decode([s.response_ids for s in out], skip_special_tokens=True)
        asks = [jt(probs[i // a.samples].prompt + t + "?", add_special_tokens=False)["input_ids"] for i, t in enumerate(texts)]
        verdicts = judge.generate(asks, max_new_tokens=rec.judge.max_new_tokens, temperature=0, top_p=1.0, seeds=None)
        verdicts = jt.batch_decode([s.response_ids for s in verdicts], skip_special_tokens=True)
        count, accepted = collections.Counter(), collections.Counter()
        for i, t in enumerate(texts):
            k = kind(t, probs[i // a.samples].answer)
            count[k] += 1
            accepted[k] += (parse_pointwise_score(verdicts[i]) or 0) > 5
        print(path)
        for k, n in count.most_common():
            print(f"  {k:26s} {n / len(texts):.3f} of answers; the judge accepts {accepted[k] / n:.2f} of them")


if __name__ == "__main__":
    main()
