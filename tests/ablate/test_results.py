"""The raw results file of `credo ablate` and `credo report` on it: the schema, resuming from the file alone,
replacing a rerun's line, concurrent writers, the table remade from the file, and the doc blocks' check."""

import json
import math
import threading

import pytest

from credo import ablate
from credo.ablate import report_cli
from credo.ablate.results import read_results, upsert_results
from credo.config import ConfigError
from tests.ablate.test_sweep import acc, fake_trainer, invocations, write_sweep  # noqa: F401 (fixture)


def _report(capsys, *argv) -> tuple[int, str, str]:
    parser = report_cli._parser()
    code = report_cli.report_main(parser.parse_args(list(argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_finished_run_writes_one_line_with_the_schema(tmp_path, fake_trainer):
    path = write_sweep(tmp_path, baseline="a", results=str(tmp_path / "res" / "t.jsonl"),
                       curves=["eval/accuracy", "train/reward_mean"])
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    recs = read_results(tmp_path / "res" / "t.jsonl")
    assert sorted((r["variant"], r["seed"]) for r in recs) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    r = next(r for r in recs if (r["variant"], r["seed"]) == ("b", 1))
    assert list(r)[:4] == ["schema", "sweep", "variant", "seed"] and r["schema"] == 1 and r["sweep"] == "t"
    assert r["sft_seed"] == 1  # warmup_seed defaults to the run's seed
    assert r["overrides"] == ["optim.lr=0.0002"]
    assert r["commit"] and r["date"][:2] == "20" and isinstance(r["wall_s"], float) and r["steps"] == 3
    assert {"cpu", "cpu_capability", "threads", "torch"} <= set(r["host"])
    # final: every number at the last step; curves: step -> value as the trainer logged them
    assert r["final"] == {"eval/accuracy": pytest.approx(acc(2e-4, 1, 3)), "train/reward_mean": pytest.approx(acc(2e-4, 1, 3) - 0.5)}
    assert r["curves"]["eval/accuracy"] == {str(s): pytest.approx(acc(2e-4, 1, s)) for s in range(4)}
    assert list(r["curves"]["train/reward_mean"]) == ["1", "2", "3"]
    assert r["values"]["eval/accuracy final"] == pytest.approx(acc(2e-4, 1, 3))
    # b's seed-1 run and a's seed-1 run warmed up from one key; seeds 0 and 1 from two
    keys = {(x["variant"], x["seed"]): x["warmup_key"] for x in recs}
    assert keys[("a", 1)] == keys[("b", 1)] != keys[("a", 0)] == keys[("b", 0)]


def test_a_recorded_run_is_not_rerun_even_without_its_folder(tmp_path, fake_trainer, capsys):
    import shutil

    path = write_sweep(tmp_path, baseline="a")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    table = (tmp_path / "sweep" / "table.md").read_text()
    shutil.rmtree(tmp_path / "sweep" / "runs")  # a fresh checkout: only the results file is left
    capsys.readouterr()
    assert ablate.run_sweep(path, jobs=2, dry_run=True) == 0
    assert "4 finished, 0 to run" in capsys.readouterr().out
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    assert not (tmp_path / "sweep" / "runs").exists()  # nothing started
    assert (tmp_path / "sweep" / "table.md").read_text() == table


def test_a_rerun_replaces_its_line_and_keeps_the_others(tmp_path, fake_trainer):
    res = tmp_path / "shared.jsonl"
    other = {"sweep": "other", "variant": "x", "seed": 0, "final": {}, "curves": {}}
    upsert_results(res, [other])
    path = write_sweep(tmp_path, results=str(res))
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    before = {(r["sweep"], r["variant"], r["seed"]): r for r in read_results(res)}
    changed = write_sweep(tmp_path, results=str(res), output_dir=str(tmp_path / "sweep2"),
                          variants={"a": ["optim.lr=0.0001"], "b": ["optim.lr=0.0003"]})
    assert ablate.run_sweep(changed, jobs=2, poll_s=0.05, exploratory=True) == 0
    after = read_results(res)
    assert [(r["sweep"], r["variant"], r["seed"]) for r in after] == list(before)  # replaced in place, none added
    by = {(r["sweep"], r["variant"], r["seed"]): r for r in after}
    assert by[("t", "b", 0)]["final"]["eval/accuracy"] == pytest.approx(acc(3e-4, 0, 3))
    assert by[("t", "a", 0)] == before[("t", "a", 0)] and by[("other", "x", 0)] == other
    assert not (tmp_path / "sweep2" / "runs" / "a").exists()  # a was recorded with the same config: not rerun


def test_concurrent_writers_lose_no_line(tmp_path):
    res = tmp_path / "r.jsonl"

    def write(who):
        for i in range(25):
            upsert_results(res, [{"sweep": who, "variant": "v", "seed": i, "final": {}, "curves": {}}])

    threads = [threading.Thread(target=write, args=(f"s{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted((r["sweep"], r["seed"]) for r in read_results(res)) == sorted((f"s{k}", i) for k in range(4) for i in range(25))
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # no temporary or lock file left behind


def test_bad_results_lines_are_named(tmp_path):
    res = tmp_path / "r.jsonl"
    res.write_text('{"sweep": "t", "variant": "a", "seed": 0, "final": {}, "curves": {}}\n{"sweep": "t"\n')
    with pytest.raises(ConfigError, match=r"results file '.*r.jsonl', line 2: not valid JSON"):
        read_results(res)
    res.write_text('{"sweep": "t", "variant": "a", "final": {}, "curves": {}}\n')
    with pytest.raises(ConfigError, match=r"line 1: missing key 'seed'"):
        read_results(res)


def test_report_remakes_the_sweeps_table_from_the_results_file(tmp_path, fake_trainer, capsys):
    path = write_sweep(tmp_path, baseline="a", comparisons=["b > a"])
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    table = (tmp_path / "sweep" / "table.md").read_text()
    capsys.readouterr()
    code, out, _ = _report(capsys, str(path), "--notes")
    assert code == 0 and out in table  # the sweep's table.md is this output plus its title and variant list
    assert "**Comparisons named: eval/accuracy final**" in out and "| b > a |" in out and "as named" in out
    # the same from the results file alone, naming the design with flags
    code, out2, _ = _report(capsys, str(tmp_path / "sweep" / "results.jsonl"), "--metric", "eval/accuracy:final",
                            "--metric", "eval/accuracy:best", "--metric", "train/reward_mean:last_k_mean:2",
                            "--baseline", "a", "--compare", "b > a", "--notes")
    assert code == 0 and out2 == out
    code, _, _ = _report(capsys, str(path), "--plot", str(tmp_path / "c.png"))
    assert code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_report_errors_name_what_is_wrong(tmp_path, capsys):
    res = tmp_path / "r.jsonl"
    upsert_results(res, [{"sweep": s, "variant": "a", "seed": 0, "final": {}, "curves": {}} for s in ("s1", "s2")])
    for argv, message in [([str(tmp_path / "none.jsonl")], "results file not found"),
                          ([str(res)], "holds sweeps s1, s2; name one with --sweep"),
                          ([str(res), "--sweep", "s1", "--metric", "eval/accuracy:median"], "--metric 'eval/accuracy:median'"),
                          ([str(res), "--sweep", "s1", "--metric", "x:last_k_mean"], "ARG is k >= 1 for last_k_mean"),
                          ([str(res), "--sweep", "s1", "--compare", "a >> b"], "--compare = 'a >> b', expected 'A > B'"),
                          ([str(res), "--sweep", "s1", "--baseline", "zz"], "'zz' names no variant")]:
        code, _, err = _report(capsys, *argv)
        assert code == 2 and message in err, (argv, err)
    # a key no run recorded a curve of: an error naming it and the recorded ones, not an empty table and exit 0
    rec = tmp_path / "rec.jsonl"
    upsert_results(rec, [{"sweep": "s", "variant": "a", "seed": 0, "final": {"perf/rss": 1.0},
                          "curves": {"eval/accuracy": {"0": 0.5}}}])
    code, out, err = _report(capsys, str(rec), "--metric", "perf/rss:final")
    assert code == 2 and out == "" and "metric 'perf/rss'" in err and "curves recorded: eval/accuracy" in err


def test_metric_parsing():
    m = report_cli.parse_metric("train/reward_mean:last_k_mean:10")
    assert (m.key, m.reduce, m.k, m.label) == ("train/reward_mean", "last_k_mean", 10, "train/reward_mean last-10 mean")
    assert report_cli.parse_metric("eval/accuracy:best:min").mode == "min"
    assert report_cli.parse_metric("eval/accuracy").reduce == "final"


def test_doc_blocks_update_then_check(tmp_path, fake_trainer, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, baseline="a", results="res.jsonl")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    doc = tmp_path / "doc.md"
    fenced = "```\n<!-- credo report none.jsonl -->\nan example, not a table\n<!-- /credo report -->\n```\n"
    doc.write_text("# Title\n\n<!-- credo report res.jsonl --metric eval/accuracy:final --baseline a --no-overview -->\n"
                   "old table\n<!-- /credo report -->\n\ntext after\n" + fenced)
    capsys.readouterr()
    code, _, err = _report(capsys, "--check", str(doc))
    assert code == 1 and "stale block in" in err
    assert _report(capsys, "--update", str(doc))[0] == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\n<!-- credo report res.jsonl") and text.endswith("<!-- /credo report -->\n\ntext after\n"
                                                                                       + fenced)
    assert "| a | 2 |" in text and "old table" not in text
    code, out, _ = _report(capsys, "--check", str(doc))
    assert code == 0 and "1/1 blocks" in out
    doc.write_text(text.replace("| b | 2 |", "| b | 3 |"))  # a hand edit of a number
    assert _report(capsys, "--check", str(doc))[0] == 1


# --------------------------------------------------------------------------------------- warm-up design


def test_warmup_seed_pins_or_follows_the_run_or_the_recipe(tmp_path):
    def groups(**fields):
        runs = ablate.plan_runs(ablate.load_sweep(write_sweep(tmp_path, seeds=[0, 1, 2], **fields)), threads=1)
        return {(r.variant, r.seed): (r.warmup_group, r.recipe.sft.seed) for r in runs}

    default = groups()
    assert {v for v, _ in default.values()} == {default[("a", s)][0] for s in (0, 1, 2)}  # one per seed
    assert all(default[("a", s)] == default[("b", s)] and default[("a", s)][1] == s for s in (0, 1, 2))
    pinned = groups(warmup_seed=7)
    assert len({g for g, _ in pinned.values()}) == 1 and {s for _, s in pinned.values()} == {7}
    recipe = groups(warmup_seed="recipe", variants={"a": ["sft.seed=3"], "b": ["sft.seed=4"]})
    assert {k: s for k, (_, s) in recipe.items()} == {("a", 0): 3, ("a", 1): 3, ("a", 2): 3, ("b", 0): 4, ("b", 1): 4, ("b", 2): 4}
    with pytest.raises(ConfigError, match=r"variants.a: 'sft.seed=3' sets sft.seed, which the sweep's warmup_seed sets"):
        ablate.load_sweep(write_sweep(tmp_path, variants={"a": ["sft.seed=3"]}))
    with pytest.raises(ConfigError, match=r"warmup_seed = 'each', expected run"):
        ablate.load_sweep(write_sweep(tmp_path, warmup_seed="each"))
    with pytest.raises(ConfigError, match=r"comparisons\[0\]: 'z' names no variant"):
        ablate.load_sweep(write_sweep(tmp_path, comparisons=["a > z"]))


def test_the_table_says_whether_warmup_variance_is_inside(tmp_path, fake_trainer):
    pinned = write_sweep(tmp_path, warmup_seed=0, output_dir=str(tmp_path / "pinned"))
    assert ablate.run_sweep(pinned, jobs=2, poll_s=0.05, exploratory=True) == 0
    assert "Warm-up pinned (warm-up seed 0)" in (tmp_path / "pinned" / "table.md").read_text()
    assert "intervals leave warm-up variance out" in (tmp_path / "pinned" / "table.md").read_text()
    own = write_sweep(tmp_path, output_dir=str(tmp_path / "own"))
    assert ablate.run_sweep(own, jobs=2, poll_s=0.05, exploratory=True) == 0
    text = (tmp_path / "own" / "table.md").read_text()
    assert "Each seed trains its own warm-up: the intervals include warm-up variance; the variants of a seed share" in text


# -------------------------------------------------------------------------------------------- curves


def test_auc_and_tail_slope_against_numpy_and_scipy():
    import numpy as np
    import scipy.stats

    steps = [0, 25, 50, 75, 100, 125, 150]
    vals = [0.39, 0.45, 0.52, 0.55, 0.57, 0.575, 0.58]
    points = list(zip(steps, vals))
    M = ablate.Metric
    auc = ablate.reduce_curve(points, M("eval/accuracy", "auc"))
    assert auc == pytest.approx(np.trapezoid(vals, steps) / 150, rel=1e-12)
    # the last fifth of 0..150 is steps >= 120: 125 and 150, a two-point slope; per 100 steps
    slope = ablate.reduce_curve(points, M("eval/accuracy", "slope"))
    assert slope == pytest.approx(100 * (0.58 - 0.575) / 25, rel=1e-12)
    dense = [(s, 0.3 + 0.001 * s + 0.01 * math.sin(s)) for s in range(1, 151)]
    ref = scipy.stats.linregress([s for s, _ in dense if s >= 150 - 149 / 5], [v for s, v in dense if s >= 150 - 149 / 5])
    assert ablate.reduce_curve(dense, M("train/reward_mean", "slope")) == pytest.approx(100 * ref.slope, rel=1e-10)
    # fewer than two points in the last fifth: the last two points
    assert ablate.reduce_curve([(0, 0.1), (50, 0.2), (150, 0.5)], M("k", "slope")) == pytest.approx(100 * 0.3 / 100)
    assert ablate.reduce_curve([(0, 0.1)], M("k", "slope")) is None
    assert ablate.reduce_curve([(0, 0.1)], M("k", "auc")) == 0.1
    flat = ablate.reduce_curve([(s, 0.5) for s in range(0, 151, 25)], M("k", "slope"))
    assert flat == 0.0
