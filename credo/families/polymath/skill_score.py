"""Skill scoring: rank candidate training samples by the skills they exercise (arXiv 2601.03111, Sec. "salient
skills predict a sample's polymath value").

The paper has an LLM list the math skills a sample exercises and finds that samples whose skills are salient
across disciplines transfer best. Here the skills come from the task generators' own tags (`Problem.meta
['skills']`, credo.tasks.skill_tags), or optionally from an LLM judge (credo.families.polymath.judge_skills):

    weight(s) = (1/D) sum_d  share of discipline d's problems that exercise skill s      (how widely s is needed)
    score(x)  = sum_{s exercised by x} weight(s)                                          (the needed skills x covers)

Candidates are ranked by score, then by the total count of their skill uses, then by their order (so a ranking is
a pure function of the candidates). Inferred: the paper's exact scoring rule is not in the abstract; coverage of
widely needed skills is its stated criterion.
"""

from __future__ import annotations

from typing import Any, Iterable


def skill_weights(problems_by_discipline: dict[str, list[Any]]) -> dict[str, float]:
    """weight(s): the mean over disciplines of the share of each discipline's problems whose tags include s.

    Args:
        problems_by_discipline: discipline -> problems (each with meta['skills'], skill -> count).
    """
    shares: dict[str, float] = {}
    used = [ps for ps in problems_by_discipline.values() if ps]
    for problems in used:
        for p in problems:
            for skill, n in p.meta.get("skills", {}).items():
                if n > 0:
                    shares[skill] = shares.get(skill, 0.0) + 1.0 / len(problems) / len(used)
    return shares


def skill_score(skills: dict[str, int], weights: dict[str, float]) -> float:
    """The summed weight of the skills a problem exercises (each counted once)."""
    return sum(weights.get(s, 0.0) for s, n in skills.items() if n > 0)


def rank_candidates(candidates: Iterable[tuple[Any, Any]], weights: dict[str, float],
                    scores: dict[Any, float] | None = None) -> list[tuple[float, Any]]:
    """(score, key) of each (key, problem) candidate, best first.

    `scores` (key -> score, e.g. a judge's) replaces the tag score of the candidates it has. Ties go to more
    skill uses in all, then to the earlier candidate.
    """
    rows = []
    for order, (key, problem) in enumerate(candidates):
        tags = problem.meta.get("skills", {})
        s = scores[key] if scores is not None and key in scores else skill_score(tags, weights)
        rows.append((-s, -sum(tags.values()), order, s, key))
    rows.sort(key=lambda r: r[:3])
    return [(r[3], r[4]) for r in rows]


def candidates_of(task, disciplines: list[str], per_discipline: int) -> list[tuple[tuple[str, int], Any]]:
    """((discipline, index), problem) for the first `per_discipline` training problems of each discipline."""
    return [((d, k), task.discipline_train(d, k)) for d in disciplines
            for k in range(min(per_discipline, task.discipline_size(d)))]


def best_sample(task, disciplines: list[str], eval_disciplines: list[str], per_discipline: int,
                scores: dict | None = None) -> tuple[tuple[str, int], float, list]:
    """The top-ranked candidate among `disciplines`, with weights from the training problems of `eval_disciplines`
    (the skills the multi-domain evaluation needs; training problems, so no held-out problem is looked at).

    Returns:
        ((discipline, index), its score, the whole ranking).
    """
    weights = skill_weights({d: [p for _, p in candidates_of(task, [d], per_discipline)] for d in eval_disciplines})
    ranking = rank_candidates(candidates_of(task, disciplines, per_discipline), weights, scores)
    return ranking[0][1], ranking[0][0], ranking
