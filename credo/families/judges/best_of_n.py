"""Best-of-N evaluation with a pointwise CE-RM judge (arXiv 2601.20327): does the judge's pick beat chance?

For each held-out problem p the policy samples S = max(ns) responses r_p,0 .. r_p,S-1 once. The judge scores
each one CE-RM style, in two turns:

    turn 1   criteria c_p from the query alone, one list per problem, shared by its S responses (the point of
             unified criteria: the S scores are on one scale)
    turn 2   score s_p,i in 0-10 of r_p,i against c_p (the last \\boxed{}; None when it does not parse)

and the verifier scores each response, v_p,i in {0, 1}. For each N in `ns` the first N samples of every
problem (nested prefixes of the same S, so the N differ only in N) give three accuracies over problems:

    judge     v_p,k with k = argmax_{i<N} s_p,i   (ties broken uniformly at random with the seed; None is lowest)
    random    mean_{i<N} v_p,i                    (the expected accuracy of a uniform pick: the samples' mean)
    oracle    max_{i<N} v_p,i                     (the verifier's pick: pass@N)

`best_of_n_table` is that arithmetic on given scores; `run_best_of_n` loads the models of a recipe (policy:
model/sft/task/rollout; judge: the `judge:` section, warmed up on `ce_rm_arithmetic`) and produces them.
"""

from __future__ import annotations

import math
import random

from credo.config import ConfigError

__all__ = ["pick_best", "best_of_n_table", "check_bon", "sample_policy", "judge_scores", "run_best_of_n"]


def pick_best(scores: list[float | None], rng: random.Random) -> int:
    """Index of the highest score; None counts below every number; a tie goes to a uniform draw of `rng`.

    Args:
        scores: [N] judge scores (None = unparseable), N >= 1.
    """
    keyed = [-math.inf if s is None else s for s in scores]
    top = max(keyed)
    return rng.choice([i for i, s in enumerate(keyed) if s == top])


def best_of_n_table(scores: list[list[float | None]], correct: list[list[float]], ns: list[int],
                    seed: int) -> dict[int, dict[str, float]]:
    """{N: {"judge", "random", "oracle"}} accuracies over problems, as in the module docstring.

    Args:
        scores: [P][S] judge scores (None = unparseable).
        correct: [P][S] verifier scores in [0, 1].
        ns: the N, each in [1, S].
        seed: the tie-break seed; problem p at N draws from its own `random.Random((seed, p, N))`-like stream,
            so one N's picks do not depend on which other N are asked for.
    """
    P = len(scores)
    if P == 0 or len(correct) != P:
        raise ValueError(f"scores has {P} problems and correct {len(correct)}: expected the same number, >= 1")
    table = {}
    for n in ns:
        judge = rand = oracle = 0.0
        for p, (sc, ok) in enumerate(zip(scores, correct)):
            if not 1 <= n <= min(len(sc), len(ok)):
                raise ValueError(f"N = {n} but problem {p} has {len(sc)} scores and {len(ok)} verdicts")
            k = pick_best(sc[:n], random.Random(f"bon:{seed}:{p}:{n}"))
            judge += ok[k]
            rand += sum(ok[:n]) / n
            oracle += max(ok[:n])
        table[n] = {"judge": judge / P, "random": rand / P, "oracle": oracle / P}
    return table


def check_bon(recipe, ns: list[int]) -> str:
    """Everything `run_best_of_n` needs, checked before any model loads; returns the judge's turn-2 template.

    Raises:
        ConfigError: naming the key (or `--n`) at fault.
    """
    from credo.families.judges.prompts import CRITERIA_POINTWISE_TEMPLATE, check_template, template_fields
    from credo.families.judges.tasks import COMPACT_CRITERIA_POINTWISE

    if not ns or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ns):
        raise ConfigError(f"--n = {list(ns)}: expected one or more integers >= 1 (e.g. --n 1 4 16)")
    j = recipe.judge
    if not j.path:
        raise ConfigError("config key 'judge.path' is required by credo bon: expected 'tiny', a Hugging Face model "
                          "folder (e.g. a ce_rm run's final/) or a hub id")
    if j.mode != "pointwise":
        raise ConfigError(f"config key 'judge.mode' = '{j.mode}': credo bon scores each response alone, expected "
                          "'pointwise'")
    template = j.template or CRITERIA_POINTWISE_TEMPLATE
    check_template(template, "pointwise")
    if "criteria" not in template_fields(template):
        raise ConfigError(f"config key 'judge.template' = {template!r} lacks the field {{criteria}}: CE-RM scores "
                          "against criteria written from the query first (e.g. '{criteria}|{question}{response}?')")
    if j.warmup_steps:
        if recipe.task.name != "arithmetic":
            raise ConfigError(f"config key 'judge.warmup_steps' = {j.warmup_steps}: expected 0 unless task.name = "
                              f"'arithmetic' (the warm-up is ce_rm_arithmetic built from it; got '{recipe.task.name}')")
        if template != COMPACT_CRITERIA_POINTWISE:
            raise ConfigError(f"config key 'judge.template' = {template!r}: a judge warmed up on ce_rm_arithmetic "
                              f"(judge.warmup_steps > 0) reads {COMPACT_CRITERIA_POINTWISE!r}")
        bad = {"mode", "template"} & set(j.warmup_kwargs)
        if bad:
            raise ConfigError(f"config key 'judge.warmup_kwargs.{sorted(bad)[0]}': ce_rm_arithmetic fixes it")
    if j.backend != "hf":
        raise ConfigError(f"config key 'judge.backend' = '{j.backend}': credo bon runs the judge with hf")
    if recipe.task.name in ("file",) or recipe.task.name.startswith("hf:"):
        raise ConfigError(f"config key 'task.name' = '{recipe.task.name}': best-of-N needs a task with a verifier")
    return template


def criteria_template_for(template: str) -> str:
    """Turn 1's prompt: the compact one the tiny judge is warmed up on with the compact turn 2, else the paper's."""
    from credo.families.judges.prompts import CRITERIA_TEMPLATE
    from credo.families.judges.tasks import COMPACT_CRITERIA, COMPACT_CRITERIA_POINTWISE

    return COMPACT_CRITERIA if template == COMPACT_CRITERIA_POINTWISE else CRITERIA_TEMPLATE


def _generate(backend, tok, texts: list[str], *, max_new_tokens: int, temperature: float, top_p: float,
              seeds: list[int] | None) -> list[str]:
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    out = backend.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature or 1.0, top_p=top_p,
                           seeds=None if temperature == 0 else seeds)
    from credo.families.judges.reward import own_continuation

    return tok.batch_decode([own_continuation(p, s.response_ids) for p, s in zip(ids, out)], skip_special_tokens=True)


def sample_policy(backend, tok, prompts: list[str], S: int, *, max_new_tokens: int, temperature: float,
                  top_p: float, seed: int) -> list[list[str]]:
    """[P][S] sampled responses; the seed of sample s of problem j is a function of (seed, j, s) alone."""
    from credo.train.rollout import step_seed

    texts = [p for p in prompts for _ in range(S)]
    seeds = [step_seed(seed, -2, i) for i in range(len(texts))]
    flat = _generate(backend, tok, texts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                     seeds=seeds)
    return [flat[j * S:(j + 1) * S] for j in range(len(prompts))]


def judge_scores(backend, tok, questions: list[str], responses: list[list[str]], *, template: str,
                 criteria_template: str, max_new_tokens: int, temperature: float = 0.0, lo: float = 0,
                 hi: float = 10, seed: int = 0) -> tuple[list[list[float | None]], list[str]]:
    """CE-RM's two turns, one generate call each: ([P][S] scores (None = unparseable), [P] criteria texts)."""
    from credo.families.judges.parse import parse_pointwise_score
    from credo.families.judges.prompts import pointwise_prompt
    from credo.families.judges.tasks import render_criteria
    from credo.train.rollout import step_seed

    crit = _generate(backend, tok, [render_criteria(q, criteria_template) for q in questions],
                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0,
                     seeds=[step_seed(seed, -3, j) for j in range(len(questions))])
    # the generated criteria are context only: the same strip as the training rollout's batch_decode gives
    prompts = [pointwise_prompt(q, r, template=template, lo=lo, hi=hi, criteria=c)
               for q, c, rs in zip(questions, crit, responses) for r in rs]
    flat = _generate(backend, tok, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0,
                     seeds=[step_seed(seed, -4, i) for i in range(len(prompts))])
    scores = [parse_pointwise_score(t, lo, hi) for t in flat]
    out, i = [], 0
    for rs in responses:
        out.append(scores[i:i + len(rs)])
        i += len(rs)
    return out, crit


def run_best_of_n(recipe, ns: list[int], *, log=print) -> dict:
    """Best-of-N of `recipe`'s policy under its `judge:` section (see the module docstring).

    Uses task.eval_problems() (all of the held-out split), rollout.max_new_tokens / temperature / top_p for
    the policy's S = max(ns) samples (transformers generate whatever rollout.backend says), run.seed for the
    sampling and the tie-breaks, and judge.max_new_tokens / temperature / score_range for both turns.

    Returns:
        A JSON-able dict: "table" {N: {judge, random, oracle}}, "unparseable_frac", "format_in_answer" (share of
        samples holding a verdict box themselves), "judge_label_accuracy"
        (share of samples whose score falls on the verifier's side of the middle of the range),
        "criteria" [P], "responses" [P][S], "scores" [P][S], "correct" [P][S], and the settings.
    """
    import time

    from credo.models import load_tokenizer, resolve_model_path
    from credo.tasks import make_task
    from credo.families.judges.reward import check_judge_context, load_judge, question_text
    from credo.family import families_of
    from credo.families.judges.untrusted import contains_verdict
    from credo.train.registry import StageContext

    template = check_bon(recipe, ns)
    task = make_task(recipe.task, families_of(recipe))
    if getattr(task, "score", None) is None:
        raise ConfigError(f"config key 'task.name' = '{recipe.task.name}': best-of-N needs a task with a verifier")
    S, r, j = max(ns), recipe, recipe.judge
    lo, hi = j.score_range
    ctx = StageContext(rank=0, world=1, recipe=r, task=task, section=j)
    judge_base = resolve_model_path(j.path, j.tiny)
    check_judge_context(load_tokenizer(judge_base), judge_base, ctx, template)  # before any warm-up
    t0 = time.time()
    problems = task.eval_problems()
    policy_path, responses = _policy_samples(r, task, problems, S, log)
    correct = [[_verify(task, t, p) for t in rs] for rs, p in zip(responses, problems)]
    t_policy = time.time() - t0
    backend, jtok, judge_path = load_judge(ctx, judge_base, "ce_rm_arithmetic")
    t1 = time.time()
    scores, criteria = judge_scores(backend, jtok, [question_text(p) for p in problems], responses,
                                    template=template, criteria_template=criteria_template_for(template),
                                    max_new_tokens=j.max_new_tokens, temperature=j.temperature, lo=lo, hi=hi,
                                    seed=r.run.seed)
    flat = [(s, v) for sc, ok in zip(scores, correct) for s, v in zip(sc, ok)]
    mid = (lo + hi) / 2
    return {"table": best_of_n_table(scores, correct, ns, r.run.seed), "ns": list(ns), "samples": S,
            "problems": len(problems), "seed": r.run.seed, "policy": policy_path, "judge": judge_path,
            "unparseable_frac": sum(s is None for s, _ in flat) / len(flat),
            "format_in_answer": sum(contains_verdict(t, "pointwise", lo, hi) for rs in responses for t in rs) / len(flat),
            "judge_label_accuracy": sum(s is not None and (s > mid) == (v > 0.5) for s, v in flat) / len(flat),
            "seconds": {"policy": round(t_policy, 1), "judge": round(time.time() - t1, 1)},
            "criteria": criteria, "responses": responses, "scores": scores, "correct": correct}


def _policy_samples(r, task, problems: list, S: int, log) -> tuple[str, list[list[str]]]:
    """The policy's folder (after its cached warm-up) and its S samples per problem (transformers generate)."""
    import torch

    from credo.distributed.rollout import HFBackend
    from credo.models import check_vocab, load_causal_lm, load_tokenizer, resolve_model_path
    from credo.tasks.render import prompt_renderer

    policy_path = resolve_model_path(r.model.path, r.model.tiny)
    if r.sft.enabled and r.sft.steps > 0:
        from credo.sft import run_sft

        policy_path, _ = run_sft(r, policy_path, task, log=log)
    tok = load_tokenizer(policy_path)
    model = load_causal_lm(policy_path).eval().requires_grad_(False)
    check_vocab(model, tok, policy_path)
    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)
    ro = r.rollout
    with torch.no_grad():
        responses = sample_policy(HFBackend(model, tok), tok, [render(p) for p in problems], S,
                                  max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                                  seed=r.run.seed)
    return policy_path, responses


def _verify(task, text: str, problem) -> float:
    try:
        return float(task.score(text, problem))
    except Exception:  # noqa: BLE001 - a verifier crash on one answer scores it 0, as the evaluator does
        return 0.0
