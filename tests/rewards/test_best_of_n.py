"""Best-of-N with a CE-RM judge: the selection against a loop reference written differently, a judge that
knows the answer beats a random pick, the two-turn scoring with a scripted judge, and the CLI's errors."""

import random
from collections import Counter

import pytest

from credo.cli import main
from credo.config import ConfigError, load_recipe
from credo.families.judges.best_of_n import best_of_n_table, check_bon, judge_scores, pick_best
from credo.families.judges.tasks import COMPACT_CRITERIA, COMPACT_CRITERIA_POINTWISE
from pathlib import Path
from tests.fakes import CharTok

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ce_rm_bon.yaml"


def naive_pick(scores, rng):
    """Sort-based: order indices by (score, None last), keep the run equal to the first, draw one."""
    ranked = sorted(range(len(scores)), key=lambda i: (scores[i] is None, -(scores[i] or 0)))
    first = ranked[0]
    tied = []
    for i in ranked:
        if scores[i] == scores[first]:
            tied.append(i)
    tied.sort()
    return tied[rng.randrange(len(tied))]


def naive_table(scores, correct, ns, seed):
    out = {}
    for n in ns:
        totals = [0.0, 0.0, 0.0]
        for p in range(len(scores)):
            k = naive_pick(scores[p][:n], random.Random(f"bon:{seed}:{p}:{n}"))
            totals[0] += correct[p][k]
            s = 0.0
            for i in range(n):
                s += correct[p][i]
            totals[1] += s / n
            best = 0.0
            for i in range(n):
                if correct[p][i] > best:
                    best = correct[p][i]
            totals[2] += best
        out[n] = {"judge": totals[0] / len(scores), "random": totals[1] / len(scores), "oracle": totals[2] / len(scores)}
    return out


def test_pick_by_hand():
    rng = random.Random(0)
    assert pick_best([3, None, 7.5, 2], rng) == 2
    assert {pick_best([None, 0.0, None], rng) for _ in range(50)} == {1}  # None is below 0, never tied with it
    assert pick_best([None], rng) == 0
    # a tie is a uniform draw: over many draws both tied indices come up, the lower score never
    draws = Counter(pick_best([5, 10, 1, 10, None], rng) for _ in range(400))
    assert set(draws) == {1, 3} and min(draws.values()) > 150
    assert Counter(pick_best([None, None, None], rng) for _ in range(300)).keys() == {0, 1, 2}


def test_table_matches_a_naive_reference_with_ties_and_none():
    rng = random.Random(1)
    P, S = 40, 16
    scores = [[rng.choice([None, 0, 0, 5, 10, 10, 7.5]) for _ in range(S)] for _ in range(P)]
    correct = [[float(rng.random() < 0.4) for _ in range(S)] for _ in range(P)]
    ns = [1, 2, 4, 16]
    got, want = best_of_n_table(scores, correct, ns, seed=3), naive_table(scores, correct, ns, seed=3)
    for n in ns:
        for k in ("judge", "random", "oracle"):
            assert got[n][k] == pytest.approx(want[n][k], abs=1e-12), (n, k)
    assert got[1]["judge"] == got[1]["random"] == got[1]["oracle"]  # one sample: every pick is the same
    for a, b in zip(ns, ns[1:]):
        assert got[a]["oracle"] <= got[b]["oracle"]  # nested prefixes: pass@N cannot fall
    # one N's picks do not depend on the others asked for
    assert best_of_n_table(scores, correct, [4], seed=3)[4] == got[4]


def test_table_by_hand():
    # problem 0: the judge prefers the wrong sample; problem 1: a tie of two, one right; problem 2: all None
    scores = [[10, 0], [5, 5], [None, None]]
    correct = [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
    t = best_of_n_table(scores, correct, [2], seed=0)[2]
    assert t["random"] == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert t["oracle"] == 1.0
    assert t["judge"] in (pytest.approx(1 / 3), pytest.approx(2 / 3))  # problem 1's tie decides
    with pytest.raises(ValueError, match="N = 3"):
        best_of_n_table(scores, correct, [3], seed=0)


def test_an_informed_judge_beats_random_and_a_blind_one_does_not():
    rng = random.Random(2)
    P, S = 300, 16
    correct = [[float(rng.random() < 0.3) for _ in range(S)] for _ in range(P)]
    # right answers get a higher score than wrong ones 80% of the time, with many ties and some None
    informed = [[rng.choice([10, 10, 10, 10, 0]) if v else rng.choice([0, 0, 0, 0, 10, None]) for v in row]
                for row in correct]
    blind = [[rng.choice([0, 10, None]) for _ in row] for row in correct]
    good = best_of_n_table(informed, correct, [4, 16], seed=0)
    bad = best_of_n_table(blind, correct, [4, 16], seed=0)
    for n in (4, 16):
        assert good[n]["judge"] > good[n]["random"] + 0.2
        assert good[n]["judge"] <= good[n]["oracle"]
        assert abs(bad[n]["judge"] - bad[n]["random"]) < 0.08


class ScriptedJudge:
    """A backend that solves the sum in turn 1 and compares in turn 2, recording its calls."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        from credo.distributed.rollout import Sample

        texts = ["".join(chr(i) for i in p) for p in prompts]
        self.calls.append(texts)
        out = []
        for t in texts:
            if t.endswith("#"):  # turn 1: "07+45=#" -> "=052"
                a, b = t[:-2].split("+")
                reply = f"={int(a) + int(b):03d}"
            else:  # turn 2: "=052|07+45=052?" -> 10 if the answer equals the criteria
                crit, rest = t.split("|")
                ans = rest.split("=", 1)[1][:-1]
                reply = "\\boxed{10}" if ans == crit[1:] else ("\\boxed{0}" if ans else "no box")
            out.append(Sample([], [ord(c) for c in reply], [1] * len(reply), [0.0] * len(reply), True))
        return out


def test_two_turns_one_call_each_and_unified_criteria():
    judge = ScriptedJudge()
    responses = [["052", "042", "052."], ["", "011", "010"]]
    scores, crit = judge_scores(judge, CharTok(), ["07+45=", "03+08="], responses, template=COMPACT_CRITERIA_POINTWISE,
                                criteria_template=COMPACT_CRITERIA, max_new_tokens=12)
    assert len(judge.calls) == 2 and judge.calls[0] == ["07+45=#", "03+08=#"]
    assert judge.calls[1][:3] == ["=052|07+45=052?", "=052|07+45=042?", "=052|07+45=052.?"]  # one criteria per query
    assert crit == ["=052", "=011"]
    assert scores == [[10.0, 0.0, 0.0], [None, 10.0, 0.0]]


def test_check_names_the_key_at_fault():
    ok = load_recipe(RECIPE)
    assert check_bon(ok, [1, 4, 16]) == COMPACT_CRITERIA_POINTWISE
    for overrides, ns, match in [
        (["judge.path=null"], [1], "'judge.path'"),
        (["judge.mode=pairwise"], [1], "'judge.mode'"),
        (["judge.template='{question}{response}?'"], [1], "'judge.template'.*criteria"),
        (["judge.template='{criteria} {question} {response}'"], [1], "'judge.template'.*ce_rm_arithmetic"),
        ([], [0, 4], "--n"),
        ([], [], "--n"),
    ]:
        with pytest.raises(ConfigError, match=match):
            check_bon(load_recipe(RECIPE, overrides), ns)


def test_cli_missing_judge_path_is_a_config_error_before_any_work(capsys, tmp_path):
    out = tmp_path / "bon.json"
    assert main(["bon", str(RECIPE), "judge.path=null", "--n", "1", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "judge.path" in err
    assert not out.exists()
    assert main(["bon", str(RECIPE), "judge.nope=1"]) == 2  # strict: an unknown key
    assert "judge.nope" in capsys.readouterr().err
