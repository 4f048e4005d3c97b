"""`credo ablate` with a stand-in trainer (tests/ablate/fake_train.py): sweep files, scheduling, resuming, tables.

The stand-in logs eval/accuracy = 1000 * optim.lr + seed / 10 + step / 100 (reward = that - 0.5), so every
table cell is recomputed here from the formula with plain loops, and every interval from the closed forms of
Student's t with 1 and 2 degrees of freedom.
"""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from credo import ablate
from credo.ablate import scheduler, spec
from credo.config import ConfigError, load_recipe

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_train.py")
BASE = REPO / "recipes" / "quickstart.yaml"


@pytest.fixture
def fake_trainer(monkeypatch):
    monkeypatch.setattr(scheduler, "_train_argv", lambda base, overrides, launcher: [sys.executable, str(FAKE), "run", str(base), *overrides])
    for k in ("FAKE_TRAIN_FAIL", "FAKE_TRAIN_WARMUP_S", "FAKE_TRAIN_STEP_S"):
        monkeypatch.delenv(k, raising=False)


def write_sweep(tmp_path, **fields) -> Path:
    data = {"name": "t", "base": str(BASE), "overrides": ["run.steps=3"], "seeds": [0, 1],
            "variants": {"a": ["optim.lr=0.0001"], "b": {"optim.lr": 0.0002}},
            "metrics": [{"key": "eval/accuracy", "reduce": "final"}, {"key": "eval/accuracy", "reduce": "best"},
                        {"key": "train/reward_mean", "reduce": "last_k_mean", "k": 2}],
            "output_dir": str(tmp_path / "sweep")}
    data.update(fields)
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def invocations(run_dir: Path) -> list[dict]:
    p = run_dir / "invocations.txt"
    return [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []


def acc(lr, seed, step):
    return 1000 * lr + seed / 10 + step / 100


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------- sweep file


def test_unknown_sweep_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sweep key 'varaints'"):
        ablate.load_sweep(write_sweep(tmp_path, varaints={"a": []}, variants=None))


def test_recipe_given_as_sweep_gets_a_hint(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sweep key 'run'.*looks like a recipe"):
        ablate.load_sweep(BASE)


def test_unknown_override_key_fails_before_any_run(tmp_path, fake_trainer):
    path = write_sweep(tmp_path, variants={"a": [], "bad": ["algo.polcy_loss=ppo"]})
    with pytest.raises(ConfigError, match=r"variant 'bad' \(seed 0\): unknown config key 'algo.polcy_loss'; did you mean "
                                          r"'algo.policy_loss'"):
        ablate.run_sweep(path, jobs=1, exploratory=True)
    assert not (tmp_path / "sweep").exists()


def test_bad_value_and_bad_metric_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"variant 'a' \(seed 0\): config key 'algo.agg_mode' = 'sum'"):
        ablate.plan_runs(ablate.load_sweep(write_sweep(tmp_path, variants={"a": ["algo.agg_mode=sum"]})), threads=1)
    with pytest.raises(ConfigError, match=r"metrics\[0\].reduce = 'median', expected one of final, best, last_k_mean, gain, "
                                          r"auc, slope, first"):
        ablate.load_sweep(write_sweep(tmp_path, metrics=[{"key": "eval/accuracy", "reduce": "median"}]))
    with pytest.raises(ConfigError, match=r"unknown key 'metrics\[0\].kk'"):
        ablate.load_sweep(write_sweep(tmp_path, metrics=[{"key": "eval/accuracy", "reduce": "last_k_mean", "kk": 3}]))


@pytest.mark.parametrize("where", ["overrides", "variant"])
def test_runner_owned_keys_are_refused(tmp_path, where):
    fields = {"overrides": ["run.seed=3"]} if where == "overrides" else {"variants": {"a": ["run.output_dir=x"]}}
    with pytest.raises(ConfigError, match=r"sets run\.(seed|output_dir), which credo ablate sets per run"):
        ablate.load_sweep(write_sweep(tmp_path, **fields))


def test_grid_expands_to_named_variants_that_load(tmp_path):
    grid = {"algo.advantage": ["grpo", "lite_ppo"], "algo.loss_kwargs": [{}, {"clip_low": 0.2, "clip_high": 0.28}],
            "algo.overlong_filter": [False, True]}
    sweep = ablate.load_sweep(write_sweep(tmp_path, variants=None, grid=grid))
    assert len(sweep.variants) == 8
    name = "advantage=lite_ppo,loss_kwargs=clip_low_0.2_clip_high_0.28,overlong_filter=true"
    assert sweep.variants[name] == ["algo.advantage=lite_ppo", 'algo.loss_kwargs={"clip_low": 0.2, "clip_high": 0.28}',
                                    "algo.overlong_filter=true"]
    runs = ablate.plan_runs(sweep, threads=1)
    r = next(r for r in runs if r.variant == name and r.seed == 1)
    assert r.recipe.algo.loss_kwargs == {"clip_low": 0.2, "clip_high": 0.28} and r.recipe.algo.overlong_filter is True
    assert r.recipe.run.seed == 1 and r.recipe.run.output_dir == str(tmp_path / "sweep" / "runs" / name / "seed1")
    assert r.recipe.run.steps == 3


def test_string_values_that_look_like_numbers_stay_strings():
    assert spec._override_str("run.name", "0.5") == 'run.name="0.5"'
    assert spec._override_str("optim.lr", 1e-3) == "optim.lr=0.001"
    assert load_recipe(BASE, [spec._override_str("run.name", "true")]).run.name == "true"


def test_config_hash_ignores_output_and_threads_but_not_science():
    a = load_recipe(BASE, ["run.output_dir=x", "run.threads=1", "run.progress=false"])
    b = load_recipe(BASE, ["run.output_dir=y", "run.threads=2"])
    c = load_recipe(BASE, ["run.output_dir=x", "algo.agg_mode=seq-mean-token-mean"])
    assert ablate.config_hash(a) == ablate.config_hash(b) != ablate.config_hash(c)


def test_reduce_metric_by_hand():
    rows = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "train/reward_mean": 0.2}, {"step": 2, "eval/accuracy": 0.5,
            "train/reward_mean": 0.4}, {"step": 3, "train/reward_mean": float("nan")},
            {"step": 4, "eval/accuracy": 0.3, "train/reward_mean": 0.9}]
    M = ablate.Metric
    assert ablate.reduce_metric(rows, M("eval/accuracy", "final")) == 0.3
    assert ablate.reduce_metric(rows, M("eval/accuracy", "best")) == 0.5
    assert ablate.reduce_metric(rows, M("eval/accuracy", "best", mode="min")) == 0.1
    # last 2 finite rewards are steps 2 and 4 (step 3 is NaN and skipped): (0.4 + 0.9) / 2
    assert ablate.reduce_metric(rows, M("train/reward_mean", "last_k_mean", k=2)) == pytest.approx(0.65)
    assert ablate.reduce_metric(rows, M("train/loss", "final")) is None
    # gain: the last logged accuracy (step 4) minus the first (step 0, the warm-up's start)
    assert ablate.reduce_metric(rows, M("eval/accuracy", "gain")) == pytest.approx(0.3 - 0.1)
    assert ablate.reduce_metric(rows, M("eval/accuracy", "first")) == 0.1


def test_baseline_must_name_a_variant(tmp_path):
    with pytest.raises(ConfigError, match=r"baseline = 'grpo' does not name a variant of this sweep \(known variants: a, b\)"):
        ablate.load_sweep(write_sweep(tmp_path, baseline="grpo"))
    with pytest.raises(ConfigError, match=r"baseline = \['a'\] does not name a variant"):
        ablate.load_sweep(write_sweep(tmp_path, baseline=["a"]))
    grid = {"algo.advantage": ["grpo", "lite_ppo"]}
    assert ablate.load_sweep(write_sweep(tmp_path, variants=None, grid=grid, baseline="advantage=grpo")).baseline == \
        "advantage=grpo"
    assert ablate.load_sweep(write_sweep(tmp_path)).baseline is None


def test_seeds_default_to_five(tmp_path):
    path = write_sweep(tmp_path, seeds=None)
    assert "seeds" not in yaml.safe_load(path.read_text())
    assert ablate.load_sweep(path).seeds == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------------ running


T1 = math.tan(0.475 * math.pi)  # t(0.975) with 1 df: the Cauchy distribution, F(t) = 1/2 + atan(t) / pi
T2 = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))  # with 2 df: F(t) = 1/2 + t / (2 sqrt(2 + t^2)) = 0.975 solved for t


def mean_std(xs):
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def test_sweep_runs_tabulates_and_second_invocation_starts_nothing(tmp_path, fake_trainer, capsys):
    lrs = {"a": 1e-4, "b": 2e-4, "c": 1.2e-3}
    # c warms up differently (sft.lr), so its seeds share no warm-up with a's: Welch; b shares each seed's: paired
    path = write_sweep(tmp_path, variants={"a": ["optim.lr=0.0001"], "b": {"optim.lr": 0.0002},
                                           "c": ["optim.lr=0.0012", "sft.lr=0.002"]}, baseline="a")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    out = tmp_path / "sweep"
    rows = {r["variant"]: r for r in read_csv(out / "table.csv")}
    assert list(rows) == ["a", "b", "c"]
    stats = {}
    for variant, lr in lrs.items():
        finals = [acc(lr, s, 3) for s in (0, 1)]
        rewards = [(acc(lr, s, 2) - 0.5 + acc(lr, s, 3) - 0.5) / 2 for s in (0, 1)]
        mean, std = stats[variant] = mean_std(finals)
        row = rows[variant]
        assert row["n"] == "2"
        assert float(row["eval/accuracy final mean"]) == pytest.approx(mean)
        assert float(row["eval/accuracy final std"]) == pytest.approx(std)
        # 95% t-interval of the mean of n = 2 seeds: mean -+ t(0.975, 1) * std / sqrt(2)
        assert float(row["eval/accuracy final ci95 low"]) == pytest.approx(mean - T1 * std / math.sqrt(2))
        assert float(row["eval/accuracy final ci95 high"]) == pytest.approx(mean + T1 * std / math.sqrt(2))
        assert float(row["eval/accuracy best mean"]) == pytest.approx(mean)  # increasing curve: best = final
        assert float(row["train/reward_mean last-2 mean mean"]) == pytest.approx(sum(rewards) / 2)
        assert row["train/reward_mean last-2 mean n"] == "2"
    assert rows["a"]["eval/accuracy final diff"] == "" and rows["a"]["eval/accuracy final p"] == ""
    mean_a, std_a = stats["a"]
    j2 = 1 / math.sqrt(math.pi)  # Hedges' J at df = 2 + 2 - 2: Gamma(1) / (sqrt(1) Gamma(1/2))
    # b: each seed's pair differs by exactly 1000 * (2e-4 - 1e-4) = 0.1, so the paired test has no spread:
    # the interval is the point 0.1 and p = 0; Holm over {b, c} keeps 0
    b = rows["b"]
    assert b["eval/accuracy final test"] == "paired"
    assert float(b["eval/accuracy final diff"]) == pytest.approx(0.1)
    assert (float(b["eval/accuracy final diff ci95 low"]), float(b["eval/accuracy final diff ci95 high"])) == \
        pytest.approx((0.1, 0.1))
    assert float(b["eval/accuracy final p"]) < 1e-12 and float(b["eval/accuracy final p holm"]) < 1e-12  # rounding
    assert b["eval/accuracy final verdict"] == "b > a"
    # a paired row's effect size is g_av, whose correction J(n - 1) needs 3 pairs or more: none with 2
    assert b["eval/accuracy final g kind"] == "g_av" and b["eval/accuracy final g"] == ""
    # c: Welch, se^2 = std^2 / 2 + std_a^2 / 2 with equal variances (seed / 10 spreads every variant alike): df 2
    mean_c, std_c = stats["c"]
    diff, se = mean_c - mean_a, math.sqrt(std_c ** 2 / 2 + std_a ** 2 / 2)
    t = diff / se
    p = 1 - abs(t) / math.sqrt(2 + t * t)  # 2 (1 - F(|t|)) with the 2-df closed form above
    c = rows["c"]
    assert c["eval/accuracy final test"] == "Welch"
    assert float(c["eval/accuracy final diff"]) == pytest.approx(diff)
    assert float(c["eval/accuracy final diff ci95 low"]) == pytest.approx(diff - T2 * se)
    assert float(c["eval/accuracy final diff ci95 high"]) == pytest.approx(diff + T2 * se)
    assert float(c["eval/accuracy final p"]) == pytest.approx(p)
    # Holm over {b, c}: the smaller p (b's, ~0) is doubled, the larger (c's) multiplied by 1
    assert float(c["eval/accuracy final p holm"]) == pytest.approx(p)
    # Hedges' g: diff / pooled std (equal spreads: the pooled std is std_a) times J
    assert c["eval/accuracy final g kind"] == "g"
    assert float(c["eval/accuracy final g"]) == pytest.approx(j2 * diff / std_a)
    table = (out / "table.md").read_text()
    assert f"| a | 2 | {mean_a:.3f} ± {std_a:.3f} |" in table
    final_section = table.split("**eval/accuracy final**")[1].split("**")[0]
    assert ("| variant | n | mean ± std | 95% CI | Δ vs a [95% CI] | test | p | p (Holm) | effect size [95% CI] | verdict |"
            in final_section)
    assert "| a | 2 |" in final_section and "| baseline |" in final_section
    c_row = (f"| c | 2 | {mean_c:.3f} ± {std_c:.3f} | [{mean_c - T1 * std_c / math.sqrt(2):.3f}, "
             f"{mean_c + T1 * std_c / math.sqrt(2):.3f}] | {diff:+.3f} [{diff - T2 * se:+.3f}, {diff + T2 * se:+.3f}] | "
             f"Welch | {p:.3f} | {p:.3f} | g {j2 * diff / std_a:+.1f} [")
    assert c_row in final_section
    assert "Holm" in table and "Welch" in table and "paired" in table
    assert "Each seed trains its own warm-up: the intervals include warm-up variance; comparisons" in table
    assert (out / "curves.png").stat().st_size > 0
    status = json.loads((out / "sweep.json").read_text())
    assert status["baseline"] == "a"
    assert [(r["variant"], r["seed"], r["status"]) for r in status["runs"]] == [
        (v, s, "done") for v in "abc" for s in (0, 1)]
    run_dir = out / "runs" / "a" / "seed1"
    assert json.loads((run_dir / "DONE").read_text())["config_hash"] == status["runs"][1]["config_hash"]
    first = invocations(run_dir)
    threads = str(max(1, scheduler._cpu_count() // 2))  # cores shared by 2 jobs
    assert len(first) == 1 and first[0]["threads"] == threads and first[0]["omp"] == threads
    assert "step 3" in (run_dir / "log.txt").read_text()

    capsys.readouterr()
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    printed = capsys.readouterr().out
    assert "6 finished, 0 to run" in printed and c_row in printed  # the table is printed, CI columns included
    assert all(len(invocations(out / "runs" / v / f"seed{s}")) == 1 for v in "abc" for s in (0, 1))


def test_curve_bands_are_t_intervals_over_seeds(tmp_path, fake_trainer):
    path = write_sweep(tmp_path, curves=["eval/accuracy", "train/reward_mean"])
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    records = ablate.read_results(tmp_path / "sweep" / "results.jsonl")
    curves = ablate.curve_stats(records, ["eval/accuracy", "train/reward_mean"], ["a", "b"])
    steps, stats = curves["eval/accuracy"]["b"]
    assert steps == [0, 1, 2, 3]
    for step, s in zip(steps, stats):
        mean, std = mean_std([acc(2e-4, seed, step) for seed in (0, 1)])
        assert (s.n, s.mean) == (2, pytest.approx(mean))
        assert (s.low, s.high) == pytest.approx((mean - T1 * std / math.sqrt(2), mean + T1 * std / math.sqrt(2)))
    assert curves["train/reward_mean"]["a"][0] == [1, 2, 3]  # reward is logged from step 1


def test_failed_run_is_reported_others_tabulated_and_rerun_resumes_it(tmp_path, fake_trainer, monkeypatch, capsys):
    path = write_sweep(tmp_path, baseline="a")
    monkeypatch.setenv("FAKE_TRAIN_FAIL", "b/seed1")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 1
    err = capsys.readouterr().err
    assert "run b/seed1 failed (exit 1)" in err and "RuntimeError: injected failure at step 1" in err
    out = tmp_path / "sweep"
    rows = {r["variant"]: r for r in read_csv(out / "table.csv")}
    assert {v: r["n"] for v, r in rows.items()} == {"a": "2", "b": "1"}
    # one seed of b: a mean and a difference, but no spread, so no interval and no p-value
    b = rows["b"]
    assert float(b["eval/accuracy final mean"]) == pytest.approx(acc(2e-4, 0, 3))
    assert b["eval/accuracy final std"] == b["eval/accuracy final ci95 low"] == b["eval/accuracy final p"] == ""
    assert b["eval/accuracy final test"] == "Welch"  # seeds {0} against {0, 1}: no pairing
    assert float(b["eval/accuracy final diff"]) == pytest.approx(acc(2e-4, 0, 3) - (acc(1e-4, 0, 3) + acc(1e-4, 1, 3)) / 2)
    assert (f"| b | 1 | {acc(2e-4, 0, 3):.3f} | — | {acc(2e-4, 0, 3) - acc(1e-4, 0, 3) - 0.05:+.3f} — | Welch | — | — | — "
            "| not shown |") in (out / "table.md").read_text()
    runs = {(r["variant"], r["seed"]): r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert runs[("b", 1)]["status"] == "failed" and "injected failure" in runs[("b", 1)]["error_tail"]
    assert not (out / "runs" / "b" / "seed1" / "DONE").exists()

    monkeypatch.delenv("FAKE_TRAIN_FAIL")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    calls = invocations(out / "runs" / "b" / "seed1")
    assert [c["resume"] for c in calls] == [None, "auto"]
    assert all(len(invocations(out / "runs" / v / f"seed{s}")) == 1 for v, s in [("a", 0), ("a", 1), ("b", 0)])
    assert {r["variant"]: r["n"] for r in read_csv(out / "table.csv")} == {"a": "2", "b": "2"}
    steps = [r["step"] for r in map(json.loads, (out / "runs" / "b" / "seed1" / "metrics.jsonl").read_text().splitlines())]
    assert steps == [0, 1, 2, 3]


@pytest.mark.slow  # two fresh interpreters importing torch: ~8 s
def test_sigterm_midway_then_rerun_finishes_without_redoing(tmp_path):
    """Stop the sweep (SIGTERM) after its first run finished; the second invocation runs only the rest."""
    path = write_sweep(tmp_path)
    driver = (f"import sys; from credo.ablate import scheduler; "
              f"scheduler._train_argv = lambda b, o, l: [sys.executable, {str(FAKE)!r}, 'run', str(b), *o]; "
              f"sys.exit(scheduler.run_sweep({str(path)!r}, jobs=1, poll_s=0.05, exploratory=True))")
    env = {**os.environ, "FAKE_TRAIN_STEP_S": "0.2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out = tmp_path / "sweep"
    first = out / "runs" / "a" / "seed0"
    deadline = time.time() + 300  # generous: on a shared 2-core machine at load ~50 two fake runs took ~2 min
    second = out / "runs" / "a" / "seed1"
    while not invocations(second) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert (first / "DONE").exists() and invocations(second)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    status = {(r["variant"], r["seed"]): r["status"] for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert status[("a", 0)] == "done" and status[("a", 1)] == "interrupted" and status[("b", 1)] == "pending"
    assert not (second / "DONE").exists()

    rc = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env={**env, "FAKE_TRAIN_STEP_S": "0"}, capture_output=True,
                        text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    assert len(invocations(first)) == 1  # finished before the kill: not redone
    assert [c["resume"] for c in invocations(second)] == [None, "auto"]
    assert {r["variant"]: r["n"] for r in read_csv(out / "table.csv")} == {"a": "2", "b": "2"}


def test_changed_config_finished_run_stops_unfinished_run_restarts(tmp_path, fake_trainer, monkeypatch):
    path = write_sweep(tmp_path, seeds=[0])
    monkeypatch.setenv("FAKE_TRAIN_FAIL", "b/seed0")
    assert ablate.run_sweep(path, jobs=1, poll_s=0.05, exploratory=True) == 1
    monkeypatch.delenv("FAKE_TRAIN_FAIL")
    changed = write_sweep(tmp_path, seeds=[0], overrides=["run.steps=4"])
    with pytest.raises(ConfigError, match=r"(?s)1 finished run\(s\) were made with a different config.*runs/a/seed0: "
                                          r"run\.steps: 3 -> 4"):
        ablate.run_sweep(changed, jobs=1, poll_s=0.05, exploratory=True)
    # only the unfinished run changed: it starts again from scratch, without run.resume
    changed = write_sweep(tmp_path, seeds=[0], variants={"a": ["optim.lr=0.0001"], "b": ["optim.lr=0.0003"]})
    assert ablate.run_sweep(changed, jobs=1, poll_s=0.05, exploratory=True) == 0
    calls = invocations(tmp_path / "sweep" / "runs" / "b" / "seed0")
    assert [c["resume"] for c in calls] == [None]
    assert float(read_csv(tmp_path / "sweep" / "table.csv")[1]["eval/accuracy final mean"]) == pytest.approx(acc(3e-4, 0, 3))


def test_dry_run_lists_runs_and_writes_nothing(tmp_path, fake_trainer, capsys):
    path = write_sweep(tmp_path)
    assert ablate.run_sweep(path, jobs=2, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "2 variants x 2 seeds = 4 runs, 0 finished, 4 to run" in out
    assert "[new    ] b/seed1  optim.lr=0.0002" in out
    assert "run.seed=0" in out and "run.output_dir=" in out
    assert not (tmp_path / "sweep").exists()


def test_runs_sharing_a_warmup_wait_for_the_first(tmp_path, fake_trainer, monkeypatch):
    """Same model/task/sft/seed: the second run starts once the first has written metrics (warm-up done)."""
    monkeypatch.setenv("FAKE_TRAIN_WARMUP_S", "0.5")
    path = write_sweep(tmp_path, seeds=[0])
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    runs = tmp_path / "sweep" / "runs"
    a_start = invocations(runs / "a" / "seed0")[0]["start"]
    b_start = invocations(runs / "b" / "seed0")[0]["start"]
    assert b_start >= a_start + 0.5


def test_different_warmups_run_at_once(tmp_path, fake_trainer, monkeypatch):
    monkeypatch.setenv("FAKE_TRAIN_WARMUP_S", "1.0")
    # seeds 0 and 1 under the default warmup_seed (run): each seed needs its own warm-up
    path = write_sweep(tmp_path, variants={"a": ["optim.lr=0.0001"]})
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    runs = tmp_path / "sweep" / "runs" / "a"
    assert abs(invocations(runs / "seed0")[0]["start"] - invocations(runs / "seed1")[0]["start"]) < 0.9


def test_busy_sweep_folder_is_refused(tmp_path, fake_trainer, capsys):
    import fcntl

    path = write_sweep(tmp_path)
    (tmp_path / "sweep").mkdir()
    with open(tmp_path / "sweep" / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert ablate.run_sweep(path, jobs=1, exploratory=True) == 1
    assert "is in use by another `credo ablate`" in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "runs").exists()


# ------------------------------------------------------------------------------------------ recipes


def test_tricks_or_traps_sweep_validates_every_run():
    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "tricks_or_traps.yaml")
    runs = ablate.plan_runs(sweep, threads=1)
    assert len(sweep.seeds) >= 3 and len(runs) == len(sweep.variants) * len(sweep.seeds)
    by = {r.variant: r.recipe for r in runs if r.seed == sweep.seeds[0]}
    assert by["lite_ppo"].algo.advantage == "lite_ppo" and by["lite_ppo"].algo.agg_mode == "token-mean"
    assert by["grpo"].algo.agg_mode == "seq-mean-token-mean"
    assert by["batch_norm"].algo.advantage == "reinforce_pp" and by["batch_norm"].algo.advantage_kwargs["token_weighted"] is False
    dapo = by["dapo"].algo
    assert dapo.loss_kwargs == {"clip_low": 0.2, "clip_high": 0.28} and dapo.overlong_filter and dapo.agg_mode == "token-mean"
    # warmup_seed defaults to the run's seed: one warm-up per seed, shared by the variants of that seed (the
    # trainer's SFT cache key says so), so warm-up variance is inside the intervals and differences are paired
    assert len({r.warmup_group for r in runs}) == len(sweep.seeds)
    assert all(len({r.warmup_group for r in runs if r.seed == s}) == 1 for s in sweep.seeds)
    assert {r.recipe.sft.seed for r in runs} == set(sweep.seeds)


def test_qwen3_4b_recipe_and_sweep_load():
    r = load_recipe(REPO / "recipes" / "ablations" / "tricks_or_traps_qwen3_4b.yaml")
    assert r.model.path == "Qwen/Qwen3-4B-Base" and r.optim.lr == 1e-6
    assert (r.rollout.prompts_per_step, r.rollout.group_size, r.rollout.temperature, r.rollout.top_p) == (128, 8, 0.99, 0.99)
    sweep = ablate.load_sweep(REPO / "recipes" / "ablations" / "tricks_or_traps_qwen3_4b_sweep.yaml")
    assert len(ablate.plan_runs(sweep, threads=1)) == len(sweep.variants) * len(sweep.seeds)


def test_every_sweep_file_plans_valid_runs():
    """Each sweep in recipes/ablations loads strictly and every run's recipe validates."""
    import credo.algos as A

    planned = {}
    for path in sorted((REPO / "recipes" / "ablations").glob("*.yaml")):
        if path.name == "tricks_or_traps_qwen3_4b.yaml":  # a recipe, not a sweep
            continue
        sweep = ablate.load_sweep(path)
        assert sweep.seeds, path.name
        sweep.seeds = sweep.seeds[:1]  # every variant's recipe validates; the other seeds differ only in run.seed
        runs = planned[path.stem] = ablate.plan_runs(sweep, threads=1)
        assert len(runs) == len(sweep.variants), path.name
        assert sweep.baseline in sweep.variants, f"{path.name} names no baseline variant"
    outcome = {n for n, kind in A.ADVANTAGE_INPUTS.items() if kind == "outcome"}
    assert {r.recipe.algo.advantage for r in planned["advantages"]} == outcome
    kl = planned["kl_estimators"]
    assert {r.recipe.algo.kl_estimator for r in kl if r.recipe.algo.kl_coef > 0} == set(A.KL_ESTIMATORS)
    assert all(r.recipe.model.ref_model for r in kl)
    assert {r.recipe.algo.policy_loss for r in planned["policy_losses"]} == set(A.POLICY_LOSSES)
