"""benchmarks/ce_rm_bon.py and benchmarks/pgenrm_scaling.py: the results lines they write for `credo report`, from
hand-made per-seed JSONs of the scripts' shape, read back and reported (paired by seed, the hand-computed means)."""

import importlib.util
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from credo.ablate import report_cli
from credo.ablate.report import summarize_records
from credo.ablate.results import read_results, upsert_results
from credo.ablate.spec import Comparison
from credo.families.judges.best_of_n import best_of_n_table

REPO = Path(__file__).parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ce_rm_bon = _load("ce_rm_bon")
pgenrm_scaling = _load("pgenrm_scaling")
META = {"commit": "abc1234", "host": {"cpu": "test", "cpu_capability": "AVX2", "threads": 1, "torch": "x"},
        "date": "2026-12-07T10:00:00"}


def _report(capsys, *argv) -> str:
    code = report_cli.report_main(report_cli._parser().parse_args([str(a) for a in argv]))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


# --- CE-RM best-of-N --------------------------------------------------------------------------------------------

NS = [1, 2, 4]
ANSWERS = ["24", "16"]
# seed -> per problem (responses, verifier scores, judge scores); no ties among the judge's scores, so its pick is
# the argmax without the seeded tie-break
BON = {
    0: [(["12", "12.", "13", "12"], [1, 0, 0, 1], [3, 9, 5, 7]),
        (["7.", "8", "7", "x"], [1, 0, 1, 0], [8, 2, 6, 1])],
    1: [(["5", "5", "6.", "5"], [1, 1, 0, 1], [2, 8, 9, 1]),
        (["9.", "9.", "9.", "9."], [1, 1, 0, 0], [4, 3, 2, 1])],   # none well-formed: all samples count
    2: [(["3", "4", "3", "3"], [1, 0, 1, 1], [9, 1, 2, 3]),
        (["10", "1.0", " 10 ", "11"], [1, 0, 1, 0], [1, 2, 8, 3])],
}
CRITERIA = {0: ["=24", "=15"], 1: ["=24", "=16"], 2: ["24", "=17"]}
# by hand, at N = 4 (the judge's pick: the largest score's sample; random: the samples' mean)
JUDGE_N4 = {0: Fraction(1, 2), 1: Fraction(1, 2), 2: Fraction(1)}
RANDOM_N4 = {0: Fraction(1, 2), 1: Fraction(5, 8), 2: Fraction(5, 8)}
WELL_FORMED_N4 = {0: Fraction(7, 12), 1: Fraction(3, 4), 2: Fraction(17, 24)}
CRITERIA_ACC = {0: 0.5, 1: 1.0, 2: 0.0}


def _bon_seed_json(seed: int) -> dict:
    """A seed's JSON as benchmarks/ce_rm_bon.py keeps it: run_best_of_n's dict (through JSON, so N keys are strings)."""
    responses = [r for r, _, _ in BON[seed]]
    correct = [[float(v) for v in c] for _, c, _ in BON[seed]]
    scores = [[float(v) for v in s] for _, _, s in BON[seed]]
    flat = [v for c in correct for v in c]
    res = {"table": best_of_n_table(scores, correct, NS, seed), "ns": NS, "samples": 4,
           "unparseable_frac": 0.125 * seed, "judge_label_accuracy": 0.5 + 0.1 * seed, "criteria": CRITERIA[seed],
           "responses": responses, "scores": scores, "correct": correct, "wall_s": 90.0 + seed,
           "mean_correct": sum(flat) / len(flat)}
    return json.loads(json.dumps(res))


def _naive_well_formed(responses: list[list[str]], correct: list[list[float]], n: int) -> Fraction:
    """Uniform pick among the first n samples that are a bare number (all of them when none is), exactly."""
    per_problem = []
    for rs, cs in zip(responses, correct):
        idx = [i for i in range(n) if re.fullmatch(r"\s*[0-9]+\s*", rs[i])] or list(range(n))
        per_problem.append(Fraction(sum(int(cs[i]) for i in idx), len(idx)))
    return sum(per_problem) / len(per_problem)


@pytest.fixture
def bon_file(tmp_path):
    results = {s: _bon_seed_json(s) for s in BON}
    recs = ce_rm_bon.bon_records(results, sorted(BON), NS, answers=ANSWERS,
                                 recipe=str(REPO / "recipes" / "ce_rm_bon.yaml"), overrides=["judge.steps=10"], **META)
    path = tmp_path / "docs" / "results" / "ce_rm_bon.jsonl"
    upsert_results(path, [{**recs[0], "sweep": "other"}])   # a line of another sweep: kept, not reported
    upsert_results(path, recs)
    return path


def test_bon_records_have_the_schema_and_pair_the_picks_of_a_seed(bon_file):
    recs = [r for r in read_results(bon_file) if r["sweep"] == "ce_rm_bon"]
    assert len(read_results(bon_file)) == 13 and len(recs) == 12
    assert sorted({r["variant"] for r in recs}) == ["judge", "random", "verifier", "well_formed_random"]
    r = next(r for r in recs if (r["variant"], r["seed"]) == ("judge", 1))
    assert list(r) == ["schema", "sweep", "variant", "seed", "sft_seed", "warmup_key", "warmup_sha256", "config_hash",
                       "overrides", "commit", "date", "host", "wall_s", "steps", "final", "curves", "values"]
    assert r["schema"] == 1 and r["sft_seed"] == 1 and r["warmup_sha256"] is None and r["values"] == {}
    assert r["overrides"] == ["judge.steps=10"] and r["wall_s"] == 91.0 and r["commit"] == "abc1234"
    walls = {(x["variant"], x["seed"]): x["wall_s"] for x in recs}  # a seed's one process, counted once
    assert walls == {(v, s): (90.0 + s if v == "judge" else None) for v, s in walls}
    assert r["final"]["bon/criteria_accuracy"] == 1.0 and r["final"]["bon/label_accuracy"] == pytest.approx(0.6)
    assert r["curves"]["bon/unparseable_frac"] == {"0": 0.125}
    assert r["curves"]["bon/accuracy"] == {"1": 1.0, "2": 1.0, "4": 0.5}   # seed 1: picks 1, 1, then the '6.' (wrong)
    assert set(r["curves"]) == {"bon/accuracy", "bon/accuracy_n1", "bon/accuracy_n2", "bon/accuracy_n4",
                                "bon/criteria_accuracy", "bon/label_accuracy", "bon/unparseable_frac"}
    others = [x for x in recs if x["variant"] != "judge"]
    assert not any("bon/criteria_accuracy" in x["final"] for x in others)
    # one warm-up key per seed, the same for its four picks; a different config per seed
    keys = {(x["variant"], x["seed"]): x["warmup_key"] for x in recs}
    assert len(set(keys.values())) == 3 and all(keys[(v, s)] == keys[("judge", s)] for v, s in keys)
    assert len({x["config_hash"] for x in recs}) == 3
    # a rerun replaces its lines, keeping the other sweep's
    upsert_results(bon_file, recs)
    assert len(read_results(bon_file)) == 13


def test_bon_accuracies_per_seed_are_the_hand_computed_ones(bon_file):
    recs = [r for r in read_results(bon_file) if r["sweep"] == "ce_rm_bon"]
    by = {(r["variant"], r["seed"]): r["final"] for r in recs}
    for s in BON:
        assert by[("judge", s)]["bon/accuracy_n4"] == pytest.approx(float(JUDGE_N4[s]))
        assert by[("random", s)]["bon/accuracy_n4"] == pytest.approx(float(RANDOM_N4[s]))
        assert by[("verifier", s)]["bon/accuracy_n4"] == 1.0   # every problem has a right sample among its 4
        assert by[("judge", s)]["bon/criteria_accuracy"] == CRITERIA_ACC[s]
        responses = [r for r, _, _ in BON[s]]
        correct = [c for _, c, _ in BON[s]]
        assert by[("well_formed_random", s)]["bon/accuracy_n4"] == pytest.approx(float(WELL_FORMED_N4[s]))
        for n in NS:
            assert by[("well_formed_random", s)][f"bon/accuracy_n{n}"] == pytest.approx(
                float(_naive_well_formed(responses, correct, n)))
            first = Fraction(sum(c[0] for c in correct), len(correct))   # N = 1: every pick is sample 0
            for pick in ("judge", "random", "verifier"):
                assert by[(pick, s)]["bon/accuracy_n1"] == pytest.approx(float(first))


def test_bon_credo_report_pairs_by_seed_with_the_hand_computed_means(bon_file, capsys):
    recs = [r for r in read_results(bon_file) if r["sweep"] == "ce_rm_bon"]
    metrics = [report_cli.parse_metric("bon/accuracy_n4"), report_cli.parse_metric("bon/accuracy:final")]
    summary = summarize_records(recs, metrics, baseline="random",
                                comparisons=[Comparison("judge", "well_formed_random", "vs")])
    judge_mean = sum(JUDGE_N4.values()) / 3
    assert summary.variant("judge").stats["bon/accuracy_n4 final"].mean == pytest.approx(float(judge_mean))
    # the accuracy-against-N curve's last point is N = 4
    assert summary.variant("judge").stats["bon/accuracy final"].mean == pytest.approx(float(judge_mean))
    c = summary.vs_baseline["bon/accuracy_n4 final"]["judge"]
    assert c.test == "paired" and c.n == 3
    assert c.diff == pytest.approx(float(sum(JUDGE_N4[s] - RANDOM_N4[s] for s in BON) / 3))   # 1/12
    named = summary.named[0]
    assert named.test == "paired"
    assert named.diff == pytest.approx(float(sum(JUDGE_N4[s] - WELL_FORMED_N4[s] for s in BON) / 3))
    # the command line the doc's table is made by: the file holds another sweep, so it is named
    out = _report(capsys, bon_file, "--sweep", "ce_rm_bon", "--metric", "bon/accuracy_n4", "--metric",
                  "bon/accuracy:final", "--baseline", "random", "--compare", "judge vs well_formed_random")
    assert "the variants of a seed share its warm-up, so differences are paired by seed" in out
    assert re.search(r"^\| judge \| 3 \| 0\.667 ± ", out, re.M)
    assert re.search(r"^\| judge vs well_formed_random \| [^|]+ \| paired \|", out, re.M)
    assert re.search(r"^\| judge \| 3 \| [^|]+ \| [^|]+ \| \+0\.083 \[[^|]+\] \| paired \|", out, re.M)
    assert "Welch" not in out


# --- P-GenRM ----------------------------------------------------------------------------------------------------

USERS = [0, 0, 1]
PINNED = [True, False, False]
# seed -> setting -> per-pair correctness (1 / 0 / 0.5 for a tie)
PG = {
    0: {"none": [1, 0, 1], "ind": [1, 0.5, 1], "ind_more": [1, 0, 1], "ind_pro": [1, 1, 1], "pro": [0, 1, 1]},
    1: {"none": [1, 1, 0], "ind": [1, 0, 0], "ind_more": [1, 1, 0], "ind_pro": [1, 1, 1], "pro": [1, 1, 0]},
    2: {"none": [0, 0, 1], "ind": [1, 0, 1], "ind_more": [0, 1, 1], "ind_pro": [1, 0, 1], "pro": [0, 0, 0]},
}
# per user (user 0: pairs 0 and 1, user 1: pair 2; then the mean over the two users), by hand
PER_USER = {0: {"none": 0.75, "ind": 0.875, "ind_more": 0.75, "ind_pro": 1.0, "pro": 0.75},
            1: {"none": 0.5, "ind": 0.25, "ind_more": 0.5, "ind_pro": 1.0, "pro": 0.5},
            2: {"none": 0.5, "ind": 0.75, "ind_more": 0.75, "ind_pro": 0.75, "pro": 0.0}}


def _scaling_dict(correct: dict[str, list[float]], seed: int) -> dict:
    """run_scaling's dict (the keys benchmarks/pgenrm_scaling.py reads) from per-pair correctness."""
    def mean(v):
        return sum(v) / len(v) if v else None

    def per_user(c):
        users = sorted(set(USERS))
        return mean([mean([x for x, u in zip(c, USERS) if u == user]) for user in users])

    return {"per_user": {k: per_user(c) for k, c in correct.items()},
            "per_pair": {k: mean(c) for k, c in correct.items()},
            "by_shots": {"determined": {k: mean([x for x, p in zip(c, PINNED) if p]) for k, c in correct.items()},
                         "open": {k: mean([x for x, p in zip(c, PINNED) if not p]) for k, c in correct.items()},
                         "determined_frac": sum(PINNED) / len(PINNED)},
            "unparseable": {"greedy": 0.0, "self": 0.25, "neighbour": 0.5}, "neighbour_same_rule": 0.9 - seed / 10,
            "prototype_purity": 0.8, "seconds": {"self": 1.0, "total": 2.0}, "chains": 30, "chains_per_s": 15.0,
            "pairs": 3, "users": 2, "n_self": 8, "m_nb": 4, "k_protos": 8, "embed": "history", "c_self": 0.5,
            "c_nb": 0.5, "seed": seed, "examples": []}


def _pgenrm_file(tmp_path, *, final: bool = False) -> Path:
    results = {}
    for s in PG:
        res = {"sft": _scaling_dict(PG[s], s), "train_s": 10.0, "wall_s": 100.0 + s}
        if final:
            res["final"] = _scaling_dict({k: [1 - x for x in v] for k, v in PG[s].items()}, s)
        results[s] = json.loads(json.dumps(res))
    settings = {"n": 8, "m": 4, "k": 8, "embed": "history", "model": "final" if final else "sft"}
    recs = pgenrm_scaling.pgenrm_records(results, sorted(PG), recipe=str(REPO / "recipes" / "pgenrm.yaml"),
                                         overrides=[], settings=settings, **META)
    path = tmp_path / "pgenrm_scaling.jsonl"
    upsert_results(path, recs)
    return path


def test_pgenrm_records_hold_each_setting_per_seed(tmp_path):
    recs = read_results(_pgenrm_file(tmp_path))
    assert len(recs) == 15 and {r["sweep"] for r in recs} == {"pgenrm_scaling"}
    assert sorted({r["variant"] for r in recs}) == ["ind", "ind_more", "ind_pro", "none", "pro"]
    by = {(r["variant"], r["seed"]): r for r in recs}
    for s in PG:
        assert len({by[(v, s)]["warmup_key"] for v in PG[s]}) == 1 and by[("none", s)]["wall_s"] == 100.0 + s
        assert [by[(v, s)]["wall_s"] for v in PG[s] if v != "none"] == [None] * (len(PG[s]) - 1)
        for v in PG[s]:
            assert by[(v, s)]["final"]["pgenrm/per_user_accuracy"] == pytest.approx(PER_USER[s][v])
            assert by[(v, s)]["curves"]["pgenrm/per_user_accuracy"] == {"0": pytest.approx(PER_USER[s][v])}
            assert by[(v, s)]["final"]["pgenrm/determined_accuracy"] == PG[s][v][0]
            assert by[(v, s)]["final"]["pgenrm/open_accuracy"] == pytest.approx((PG[s][v][1] + PG[s][v][2]) / 2)
            assert by[(v, s)]["final"]["pgenrm/per_pair_accuracy"] == pytest.approx(sum(PG[s][v]) / 3)
    assert len({by[("none", s)]["warmup_key"] for s in PG}) == 3
    # the seed's diagnostics on the line of `none` only
    assert by[("none", 2)]["final"]["pgenrm/neighbour_same_rule"] == pytest.approx(0.7)
    assert by[("none", 0)]["final"]["pgenrm/determined_frac"] == pytest.approx(1 / 3)
    assert by[("none", 0)]["final"]["pgenrm/unparseable_self"] == 0.25
    assert not any("pgenrm/prototype_purity" in r["final"] for r in recs if r["variant"] != "none")
    assert not any(k.startswith("pgenrm/final/") for r in recs for k in r["final"])


def test_pgenrm_a_subset_with_no_pair_is_left_out_and_the_final_model_gets_its_own_keys(tmp_path):
    r = _scaling_dict(PG[0], 0)
    r["by_shots"]["determined"] = {k: None for k in r["by_shots"]["determined"]}
    assert "determined_accuracy" not in pgenrm_scaling.setting_metrics(r, "ind")
    assert pgenrm_scaling.setting_metrics(r, "ind")["open_accuracy"] == 0.75
    recs = read_results(_pgenrm_file(tmp_path, final=True))
    r = next(x for x in recs if (x["variant"], x["seed"]) == ("ind", 1))
    assert r["final"]["pgenrm/per_user_accuracy"] == pytest.approx(0.25)
    assert r["final"]["pgenrm/final/per_user_accuracy"] == pytest.approx(0.75)   # every pair flipped
    assert "pgenrm/final/per_user_accuracy" in r["curves"] and "pgenrm/final/prototype_purity" not in r["final"]


def test_pgenrm_credo_report_pairs_by_seed_with_the_hand_computed_differences(tmp_path, capsys):
    path = _pgenrm_file(tmp_path)
    out = _report(capsys, path, "--metric", "pgenrm/per_user_accuracy", "--baseline", "none", "--variants", "none",
                  "ind", "ind_more", "ind_pro", "--compare", "ind_pro vs ind", "--compare", "ind_pro vs ind_more")
    assert "| pro |" not in out and "Welch" not in out
    mean_pro = sum(PER_USER[s]["ind_pro"] for s in PG) / 3
    assert re.search(rf"^\| ind_pro \| 3 \| {mean_pro:.3f} ± ", out, re.M)
    d_none = sum(PER_USER[s]["ind_pro"] - PER_USER[s]["none"] for s in PG) / 3   # 1/3
    d_ind = sum(PER_USER[s]["ind_pro"] - PER_USER[s]["ind"] for s in PG) / 3     # 7/24
    assert re.search(rf"^\| ind_pro \| 3 \| [^|]+ \| [^|]+ \| \+{d_none:.3f} \[[^|]+\] \| paired \|", out, re.M)
    assert re.search(rf"^\| ind_pro vs ind \| \+{d_ind:.3f} \[[^|]+\] \| paired \|", out, re.M)
    recs = read_results(path)
    summary = summarize_records(recs, [report_cli.parse_metric("pgenrm/open_accuracy")], baseline="none")
    c = summary.vs_baseline["pgenrm/open_accuracy final"]["ind_pro"]
    open_diffs = [(sum(PG[s]["ind_pro"][1:]) - sum(PG[s]["none"][1:])) / 2 for s in PG]   # 0.5, 0.5, 0
    assert c.test == "paired" and c.diff == pytest.approx(sum(open_diffs) / 3)
