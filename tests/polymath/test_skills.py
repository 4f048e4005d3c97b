"""Skill tags and skill scoring against naive references written another way: carries and borrows by the digit-sum
identities (carries of x + y = (s(x) + s(y) - s(x + y)) / 9, borrows of x - y = (s(y) + s(x - y) - s(x)) / 9),
products by hand on digit strings, weights with exact fractions over sets, the ranking by brute force; the judge
option's parsing, and a real (untrained) tiny judge whose judgements do not parse falling back to the tags."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from credo.families.polymath.judge_skills import hf_judge, judge_scores, parse_ratings
from credo.families.polymath.mix import polymath_task
from credo.families.polymath.skill_score import best_sample, rank_candidates, skill_score, skill_weights
from credo.tasks import Problem, make_task
from credo.config import TaskConfig
from credo.tasks.skill_tags import chain_skills, column_add_skills, column_mul_skills, column_sub_skills, sort_skills


def digit_sum(n: int) -> int:
    return sum(int(c) for c in str(n))


def test_addition_tags_match_the_digit_sum_identity_and_a_string_walk():
    for a in range(100):
        for b in range(100):
            tags = column_add_skills(a, b, 2)
            assert tags.get("carry", 0) == (digit_sum(a) + digit_sum(b) - digit_sum(a + b)) // 9
            sa, sb = f"{a:02d}", f"{b:02d}"  # carry chains: a column that carries while taking a carry in
            c0 = int(sa[1]) + int(sb[1]) >= 10
            c1 = int(sa[0]) + int(sb[0]) + c0 >= 10
            assert tags.get("carry_chain", 0) == int(c0 and c1)
            assert tags["digit_add"] == tags["reverse"] == tags["scratchpad"] == 2


def test_subtraction_tags_match_the_digit_sum_identity():
    for a in range(0, 300, 7):
        for b in range(0, 300, 11):
            hi, lo = max(a, b), min(a, b)
            tags = column_sub_skills(a, b)
            assert tags.get("borrow", 0) == (digit_sum(lo) + digit_sum(hi - lo) - digit_sum(hi)) // 9
            assert tags.get("negative", 0) == int(a < b)


def test_product_tags_match_long_multiplication_on_strings():
    for a in range(100):
        for m in range(2, 10):
            carries, added, carry = 0, 0, 0
            for ch in reversed(f"{a:02d}"):
                added += carry != 0
                value = int(ch) * m + carry
                carry = int(str(value).zfill(2)[0])
                carries += carry != 0
            tags = column_mul_skills(a, m, 2)
            assert (tags.get("carry", 0), tags.get("digit_add", 0), tags["digit_mul"]) == (carries, added, 2)


def test_chain_tags_agree_with_python_on_sign_terms_and_carries():
    rng = random.Random(0)
    for _ in range(300):
        terms = [rng.randrange(0, 100) for _ in range(rng.randrange(2, 5))]
        ops = [rng.choice("+-") for _ in terms[1:]]
        expr = str(terms[0]) + "".join(f" {o} {t}" for o, t in zip(ops, terms[1:]))
        tags = chain_skills(expr)
        assert tags.get("negative", 0) == int(eval(expr) < 0)  # noqa: S307 - our own digits and signs
        assert tags.get("multi_term", 0) == len(terms) - 2
        if all(o == "+" for o in ops):  # all additions: the carries of the running sums, by the identity
            want, total = 0, terms[0]
            for t in terms[1:]:
                want += (digit_sum(total) + digit_sum(t) - digit_sum(total + t)) // 9
                total += t
            assert tags.get("carry", 0) == want and "digit_sub" not in tags


def test_sort_tags_count_repeated_letters():
    assert sort_skills("abca") == {"order": 4, "copy": 4, "repeat": 1}
    assert sort_skills("aabbc") == {"order": 5, "copy": 5, "repeat": 2}
    assert sort_skills("xyz") == {"order": 3, "copy": 3}


def test_every_built_in_generator_tags_its_problems():
    for name, kw in [("add_scratch", {"digits": 2}), ("mul_scratch", {"digits": 2}), ("sort", {"length": 5}),
                     ("arithmetic", {"ops": "+-"}), ("longtail_add", {}), ("rg:spell_backward", {})]:
        task = make_task(TaskConfig(name=name, train_size=20, eval_size=5, kwargs=kw))
        for p in [task.train(i) for i in range(20)] + task.eval_problems():
            assert p.meta["skills"] and all(isinstance(v, int) and v > 0 for v in p.meta["skills"].values()), name


def naive_weights(groups: dict[str, list[set]]) -> dict[str, Fraction]:
    skills = set().union(*[s for g in groups.values() for s in g])
    return {k: sum(Fraction(sum(k in s for s in g), len(g)) for g in groups.values()) / len(groups) for k in skills}


def random_problem(rng: random.Random) -> Problem:
    pool = ["digit_add", "carry", "order", "copy", "reverse", "borrow", "digit_mul"]
    return Problem(prompt="x", answer="y", meta={"skills": {s: rng.randrange(1, 4) for s in rng.sample(pool, rng.randrange(0, 5))}})


def test_weights_scores_and_ranking_match_brute_force():
    rng = random.Random(1)
    groups = {d: [random_problem(rng) for _ in range(rng.randrange(1, 9))] for d in "abcd"}
    weights = skill_weights(groups)
    want = naive_weights({d: [set(p.meta["skills"]) for p in ps] for d, ps in groups.items()})
    assert set(weights) == set(want) and all(abs(weights[k] - float(want[k])) < 1e-12 for k in want)
    candidates = [(i, random_problem(rng)) for i in range(40)]
    ranking = rank_candidates(candidates, weights)
    scores = {i: float(sum(want.get(s, 0) for s in p.meta["skills"])) for i, p in candidates}
    best = max(scores.values())
    tied = [i for i, _ in candidates if abs(scores[i] - best) < 1e-12]
    most_uses = max(sum(dict(candidates)[i].meta["skills"].values()) for i in tied)
    assert ranking[0][1] == min(i for i in tied if sum(dict(candidates)[i].meta["skills"].values()) == most_uses)
    assert [k for _, k in ranking] == sorted(scores, key=lambda i: (-round(scores[i], 9),
                                                                    -sum(dict(candidates)[i].meta["skills"].values()), i))
    assert abs(skill_score(candidates[0][1].meta["skills"], weights) - scores[0]) < 1e-12


def small_task():
    return polymath_task(300, 10, 0, disciplines={
        "add": {"task": "add_scratch", "kwargs": {"digits": 2}}, "sort": {"task": "sort", "kwargs": {"length": 4}},
        "combo": {"combine": ["add", "sort"]}})


def test_the_engineered_combination_outranks_every_natural_sample():
    task = small_task()
    (d, k), score, ranking = best_sample(task, task.natural, task.natural, 32)
    assert d in task.natural and score == ranking[0][0] == max(s for s, _ in ranking)
    (cd, _), combo_score, _ = best_sample(task, ["combo"], task.natural, 32)
    assert cd == "combo" and combo_score > score  # the parts' skills together cover more than any one part


def test_judge_ratings_parse_only_when_complete_and_in_range():
    assert parse_ratings(r"\boxed{3} and \boxed{10}", 2) == [3.0, 10.0]
    assert parse_ratings(r"\boxed{3}", 2) is None
    assert parse_ratings(r"\boxed{3} \boxed{11}", 2) is None
    assert parse_ratings(r"\boxed{3} \boxed{x}", 2) is None
    assert parse_ratings(r"\boxed{nan} \boxed{1}", 2) is None


def test_judge_scores_weight_the_ratings_and_count_the_fallbacks():
    cands = [("a", Problem("1+1=", "2")), ("b", Problem("sort:ba=", "ab")), ("c", Problem("x", "y"))]
    texts = {"1+1=": r"\boxed{10}\boxed{0}", "sort:ba=": r"\boxed{5}\boxed{5}", "x": "no boxes"}
    generate = lambda prompts: [next(v for k, v in texts.items() if f"Problem: {k}\n" in p) for p in prompts]  # noqa: E731
    scores, fallbacks = judge_scores(cands, ["carry", "order"], {"carry": 0.5, "order": 0.25}, generate)
    assert scores == {"a": 0.5, "b": 0.5 * 0.5 + 0.25 * 0.5} and fallbacks == 1


def test_an_untrained_tiny_judge_falls_back_to_the_tags(tmp_path, monkeypatch):
    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1,
                                            intermediate_size=64, max_position_embeddings=256))
    generate = hf_judge(str(path), max_new_tokens=8)
    cands = [(0, Problem("1+1=", "2")), (1, Problem("9" * 300, "1"))]  # the second cannot fit the judge's context
    texts = generate([f"rate {p.prompt}" for _, p in cands])
    assert isinstance(texts[0], str) and texts[1] is None
    scores, fallbacks = judge_scores(cands, ["carry"], {"carry": 1.0}, generate)
    assert scores == {} and fallbacks == 2
