"""The polymath task (mixture, tags, combined problems, formats) and the multi-domain evaluator's aggregation,
against naive references: the evaluator's per-discipline means and their mean are recomputed from a rule that
decides each answer (a seed parity written out with hashlib, or the prompt's length when greedy), and its draws
are checked against the seeds step_seed(seed, -1, j * samples + s) of the global problem index j."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from credo.distributed.rollout import Sample
from credo.errors import ConfigError
from credo.families.polymath.evaluate import MultiDomainEvaluator
from credo.families.polymath.mix import SEP, answer_shape, format_ok, polymath_task, single
from credo.models import build_char_tokenizer
from credo.tasks import Problem
from credo.tasks.render import plain_prompt
from credo.tasks.skills import SortTask

DISCIPLINES = {"add": {"task": "add_scratch", "kwargs": {"digits": 2}}, "sort": {"task": "sort", "kwargs": {"length": 4}},
               "arith": {"task": "arithmetic", "kwargs": {"max_operand": 20}}, "combo": {"combine": ["add", "sort"]}}


@pytest.fixture(scope="module")
def task():
    return polymath_task(3000, 12, 5, disciplines=DISCIPLINES, weights={"add": 2, "sort": 1, "arith": 0, "combo": 1})


def test_the_mixture_follows_the_weights_and_takes_each_disciplines_problems_in_order(task):
    counts = Counter(d for d, _ in task.order)
    assert counts["arith"] == 0 and set(counts) == {"add", "sort", "combo"}
    for d, share in (("add", 0.5), ("sort", 0.25), ("combo", 0.25)):  # 3000 draws: 5 binomial std ~ 0.04
        assert abs(counts[d] / 3000 - share) < 0.04
    seen: dict[str, int] = {}
    for d, k in task.order:
        assert k == seen.get(d, 0)
        seen[d] = k + 1
    p = task.train(7)
    assert p.meta["discipline"] == task.order[7][0] and p.meta["skills"]


def test_combined_problems_join_their_parts_and_score_the_share_of_parts_right(task):
    p = task.discipline_train("combo", 3)
    add, srt = p.meta["parts"]
    assert p.prompt == add["prompt"] + SEP + srt["prompt"] and p.answer == add["answer"] + SEP + srt["answer"]
    assert p.meta["skills"] == dict(Counter(add["meta"]["skills"]) + Counter(srt["meta"]["skills"]))
    wrong_sum = add["answer"].rsplit(">", 1)[0] + ">999"
    assert task.score(p.answer, p) == 1.0
    assert task.score(wrong_sum + SEP + srt["answer"], p) == 0.5
    assert task.score(add["answer"], p) == 0.5  # the missing piece scores 0
    assert task.score("nothing", p) == 0.0
    eval_combos = task.discipline_eval("combo")
    held = {q.prompt for d in ("add", "sort") for q in task.discipline_eval(d)}
    assert len(eval_combos) == 12 and all(set(q.prompt.split(SEP)) <= held for q in eval_combos)


def test_the_expected_format_is_the_shape_of_the_reference_answer():
    add = Problem("47+86=", "7+6+0=13,4+8+1=13>133")
    assert format_ok("1+2+0=03,5+5+0=10>103", add) and format_ok(" 7+6+0=13,4+8+1=13>133\n", add)
    assert not format_ok("7+6+0=13>133", add) and not format_ok("133", add)
    assert format_ok("xyzw", Problem("sort:wzyx=", "wxyz")) and not format_ok("wx yz", Problem("s", "wxyz"))
    assert format_ok("-12", Problem("3-15=", "-12")) and format_ok("12", Problem("3-15=", "-12"))
    assert answer_shape("a|b").pattern == r"[A-Za-z]+\|[A-Za-z]+"


def test_bad_disciplines_name_their_key():
    with pytest.raises(ConfigError, match=r"'task.kwargs.disciplines' is not set"):
        polymath_task(10, 2, 0)
    with pytest.raises(ConfigError, match=r"'task.kwargs.disciplines.x.combine' names 'nope'"):
        polymath_task(10, 2, 0, disciplines={"a": DISCIPLINES["add"], "x": {"combine": ["a", "nope"]}})
    with pytest.raises(ConfigError, match=r"'task.kwargs.disciplines.a': .*'add_scrach' is not a known task"):
        polymath_task(10, 2, 0, disciplines={"a": {"task": "add_scrach"}})
    with pytest.raises(ConfigError, match=r"unknown config key 'task.kwargs.disciplines.a.kwarg'"):
        polymath_task(10, 2, 0, disciplines={"a": {"task": "sort", "kwarg": {}}})
    with pytest.raises(ConfigError, match=r"'task.kwargs.weights.b' names no discipline"):
        polymath_task(10, 2, 0, disciplines={"a": DISCIPLINES["sort"]}, weights={"b": 1})


def naive_seed(seed: int, step: int, salt: int) -> int:
    h = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class RuleSource:
    """Answers right when the rule says so, else 'x'; records each generate call's seeds."""

    def __init__(self, tok, answers: dict[str, str], right):
        self.tok, self.answers, self.right, self.calls = tok, answers, right, []

    def generate(self, prompts, *, temperature, seeds):
        self.calls.append((prompts, seeds))
        out = []
        for i, p in enumerate(prompts):
            text = self.tok.decode(p)
            reply = self.answers[text] if self.right(text, None if seeds is None else seeds[i]) else "x"
            ids = self.tok(reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Sample(list(p), ids, [1] * len(ids), [-0.1] * len(ids), True, 0))
        return out


@pytest.mark.parametrize("temperature, samples", [(1.0, 3), (0.0, 1)])
def test_per_discipline_scores_and_their_mean_match_a_naive_count(task, temperature, samples):
    tok = build_char_tokenizer()
    names = ["add", "sort", "arith", "combo"]
    answers = {p.prompt: p.answer for d in names for p in task.discipline_eval(d)}
    if temperature:
        right = lambda text, seed: seed % 2 == 0  # noqa: E731
    else:
        right = lambda text, seed: len(text) % 2 == 0  # noqa: E731
    src = RuleSource(tok, answers, right)
    ev = MultiDomainEvaluator(task, names, tok, src, seed=11, temperature=temperature, samples=samples)
    mean = ev()
    want, j = {}, 0
    for d in names:
        hits = []
        for p in task.discipline_eval(d):
            for s in range(samples):
                hits.append(right(p.prompt, naive_seed(11, -1, j * samples + s) if temperature else None))
            j += 1
        want[d] = sum(hits) / len(hits)
    assert ev.extra_metrics == {f"eval/{d}": pytest.approx(v) for d, v in want.items()}
    assert mean == pytest.approx(sum(want.values()) / len(want))
    assert 0 < mean < 1  # the rule splits the answers: the check is not vacuous
    prompts, texts, scores = ev.last_samples
    assert len(texts) == j * samples and sum(scores) == pytest.approx(sum(s * samples * 12 for s in want.values()))


def test_ranks_deal_the_problems_round_robin_with_the_global_seeds(task):
    tok = build_char_tokenizer()
    answers = {p.prompt: p.answer for d in task.disciplines for p in task.discipline_eval(d)}
    seeds = {}
    for world in (1, 2):
        got = []
        for rank in range(world):
            src = RuleSource(tok, answers, lambda t, s: True)
            MultiDomainEvaluator(task, ["add", "sort"], tok, src, seed=3, temperature=1.0, samples=2, rank=rank,
                                 world=world)()
            prompts, rank_seeds = src.calls[-1]
            got += [(tok.decode(p), s) for p, s in zip(prompts, rank_seeds)]
        seeds[world] = sorted(got)
    assert seeds[1] == seeds[2] and len(seeds[1]) == 2 * 24


def test_a_verifier_that_raises_scores_zero_and_another_task_is_one_discipline():
    class Crashing(SortTask):
        def score(self, response, problem):
            raise RuntimeError("verifier bug")

    one = single(Crashing(20, 6, 0, length=3), "sort3")
    assert one.disciplines == ["sort3"] and len(one) == 20 and one.train(0).meta["discipline"] == "sort3"
    tok = build_char_tokenizer()
    answers = {p.prompt: p.answer for p in one.discipline_eval("sort3")}
    ev = MultiDomainEvaluator(one, ["sort3"], tok, RuleSource(tok, answers, lambda t, s: True), seed=0,
                              temperature=0.0, samples=1, render=plain_prompt)
    assert ev() == 0.0 and ev.extra_metrics == {"eval/sort3": 0.0}


def test_the_eval_cap_goes_to_the_rollout_engine_and_zero_keeps_the_sources_own(task):
    tok = build_char_tokenizer()
    answers = {p.prompt: p.answer for d in task.disciplines for p in task.discipline_eval(d)}
    caps = []

    class Engine:  # the source's rollout engine: what the source's own generate would call
        def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
            caps.append(max_new_tokens)
            return RuleSource(tok, answers, lambda t, s: True).generate(prompts, temperature=temperature, seeds=seeds)

    src = RuleSource(tok, answers, lambda t, s: True)
    src.backend = Engine()
    assert MultiDomainEvaluator(task, ["sort"], tok, src, seed=0, temperature=0.0, samples=1, max_new_tokens=9)() == 1.0
    assert caps == [9] and not src.calls
    MultiDomainEvaluator(task, ["sort"], tok, src, seed=0, temperature=0.0, samples=1)()
    assert caps == [9] and len(src.calls) == 1
