"""Optional: an LLM judge scores the skills of candidate samples (`polymath.sample.select: judge`).

The paper has an LLM analyse which skills a sample exercises. This asks a judge model, for each candidate, to rate
every skill of the vocabulary 0-10 in `\\boxed{}`s (parsed with `credo.rewards.boxed.boxed_contents`), and scores
the candidate sum_s weight(s) * rating(s) / 10 with the tag weights of `skill_score`. A judgement that does not
parse (a wrong number of boxes, a rating outside 0-10) or a prompt longer than the judge's context leaves that
candidate with its tag score; the number of such fallbacks is returned and logged. With a tiny CPU model the
ratings are noise; the option is for a real judge (a 7B+ instruct model), and the tag ranking is the default.
"""

from __future__ import annotations

import logging

from credo.rewards.boxed import boxed_contents

PROMPT = ("Rate how much solving this problem exercises each skill, from 0 (not at all) to 10 (heavily).\n"
          "Problem: {prompt}\nReference answer: {answer}\nSkills: {skills}\n"
          "Reply with one \\boxed{{rating}} per skill, in the order listed.\n")


def judge_prompt(problem, skills: list[str]) -> str:
    return PROMPT.format(prompt=problem.prompt, answer=problem.answer, skills=", ".join(skills))


def parse_ratings(text: str, n: int) -> list[float] | None:
    """The n ratings in the judgement's boxes, or None unless there are exactly n, each a number in [0, 10]."""
    boxes = boxed_contents(text)
    if len(boxes) != n:
        return None
    out = []
    for b in boxes:
        try:
            v = float(b) if b is not None else float("nan")
        except ValueError:
            return None
        if not 0 <= v <= 10:  # NaN fails too
            return None
        out.append(v)
    return out


def judge_scores(candidates: list, skills: list[str], weights: dict[str, float], generate) -> tuple[dict, int]:
    """key -> sum_s weight(s) * rating(s) / 10 for the (key, problem) candidates whose judgement parses.

    Args:
        generate: `generate(prompts: list[str]) -> list[str | None]` (None: the prompt did not fit the judge).
    Returns:
        (scores, fallbacks): the judged candidates' scores, and how many could not be judged.
    """
    texts = generate([judge_prompt(p, skills) for _, p in candidates])
    scores, fallbacks = {}, 0
    for (key, _), text in zip(candidates, texts):
        ratings = None if text is None else parse_ratings(text, len(skills))
        if ratings is None:
            fallbacks += 1
            continue
        scores[key] = sum(weights.get(s, 0.0) * r / 10 for s, r in zip(skills, ratings))
    return scores, fallbacks


def hf_judge(path: str, max_new_tokens: int):
    """`generate(prompts) -> texts` of a Hugging Face model at `path`, greedy; a prompt that does not fit the
    judge's context with max_new_tokens gives None."""
    from credo.distributed.engine import device
    from credo.distributed.rollout import HFBackend
    from credo.models import check_vocab, load_causal_lm, load_tokenizer

    tok = load_tokenizer(path)
    model = load_causal_lm(path).to(device()).eval().requires_grad_(False)
    check_vocab(model, tok, path)
    backend = HFBackend(model, tok)
    limit = getattr(model.config, "max_position_embeddings", None)

    def generate(prompts: list[str]) -> list[str | None]:
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        fits = [i for i, x in enumerate(ids) if limit is None or len(x) + max_new_tokens <= limit]
        out: list[str | None] = [None] * len(prompts)
        if fits:
            samples = backend.generate([ids[i] for i in fits], max_new_tokens=max_new_tokens, temperature=1.0,
                                       top_p=1.0, seeds=None)
            for i, s in zip(fits, samples):
                out[i] = tok.decode(s.response_ids, skip_special_tokens=True)
        return out

    return generate


def judged_best(task, disciplines, eval_disciplines, per_discipline: int, path: str, max_new_tokens: int):
    """`skill_score.best_sample` with the judge's scores in place of the tag scores where the judgement parses."""
    from credo.families.polymath.skill_score import best_sample, candidates_of, skill_weights
    from credo.tasks.skill_tags import SKILLS

    weights = skill_weights({d: [p for _, p in candidates_of(task, [d], per_discipline)] for d in eval_disciplines})
    candidates = candidates_of(task, disciplines, per_discipline)
    scores, fallbacks = judge_scores(candidates, list(SKILLS), weights, hf_judge(path, max_new_tokens))
    logging.getLogger("credo").info("polymath: the judge scored %d of %d candidates (%d fell back to their skill "
                                    "tags)", len(scores), len(candidates), fallbacks)
    return best_sample(task, disciplines, eval_disciplines, per_discipline, scores), fallbacks
