"""A real 2-variant x 2-seed sweep of the trainer (2 steps each), then a second invocation and a resume."""

import csv
import json
import shutil

import pytest
import yaml

from credo import ablate
from credo.distributed.engine import DIST_ENV_VARS
from tests.e2e.common import REPO, tiny_overrides

pytestmark = pytest.mark.slow


def test_micro_sweep_tabulates_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # reward.function names a module of this repository
    for k in DIST_ENV_VARS:  # left by in-process trainer tests
        monkeypatch.delenv(k, raising=False)
    runner_keys = ("run.output_dir=", "run.seed=", "run.plot=")
    overrides = [o for o in tiny_overrides("unused", **{"run.steps": 2, "run.eval_every": 2})
                 if not o.startswith(runner_keys)]
    sweep = {"name": "micro", "base": str(REPO / "recipes" / "quickstart.yaml"), "overrides": overrides, "seeds": [0, 1],
             "variants": {"grpo": ["algo.advantage=grpo"], "lite_ppo": ["algo.advantage=lite_ppo"]},
             "metrics": [{"key": "eval/accuracy", "reduce": "final"},
                         {"key": "train/reward_mean", "reduce": "last_k_mean", "k": 2}],
             "output_dir": str(tmp_path / "sweep")}
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    out = tmp_path / "sweep"

    assert ablate.run_sweep(path, jobs=2, poll_s=0.2, exploratory=True) == 0, capsys.readouterr().err
    err = capsys.readouterr().err  # stderr is no terminal here: plain lines, one per finished run
    assert "\r" not in err and sum(line.startswith("done   ") for line in err.splitlines()) == 4, err
    with open(out / "table.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["variant"], r["n"]) for r in rows] == [("grpo", "2"), ("lite_ppo", "2")]
    # the table agrees with the runs' own metrics: per variant, the final accuracy is the mean of its seeds'
    # step-2 evals, the reward the mean over seeds of each seed's last 2 logged rewards
    for r in rows:
        finals, rewards = [], []
        for s in (0, 1):
            logged = [json.loads(l) for l in (out / "runs" / r["variant"] / f"seed{s}" / "metrics.jsonl").read_text()
                      .splitlines()]
            finals += [row["eval/accuracy"] for row in logged if row["step"] == 2]
            seed_rewards = [row["train/reward_mean"] for row in logged if "train/reward_mean" in row]
            rewards.append(sum(seed_rewards[-2:]) / 2)
        assert len(finals) == 2 and r["train/reward_mean last-2 mean n"] == "2"
        assert float(r["eval/accuracy final mean"]) == pytest.approx(sum(finals) / 2)
        assert float(r["train/reward_mean last-2 mean mean"]) == pytest.approx(sum(rewards) / 2)
    status = json.loads((out / "sweep.json").read_text())["runs"]
    assert all(r["status"] == "done" and r["exit_code"] == 0 for r in status)
    assert len({r["config_hash"] for r in status}) == 4
    assert (out / "curves.png").stat().st_size > 0 and "| grpo | 2 |" in (out / "table.md").read_text()

    logs = {p: p.read_text() for p in out.glob("runs/*/*/log.txt")}
    capsys.readouterr()
    assert ablate.run_sweep(path, jobs=2, poll_s=0.2, exploratory=True) == 0
    assert "4 finished, 0 to run" in capsys.readouterr().out
    assert {p: p.read_text() for p in out.glob("runs/*/*/log.txt")} == logs  # no run started

    # a run cut short (no DONE, no checkpoint, metrics up to step 1): only it runs again, from scratch
    cut = out / "runs" / "lite_ppo" / "seed1"
    (cut / "DONE").unlink()
    shutil.rmtree(cut / "checkpoints")
    metrics = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(metrics[:2]) + "\n")
    # nor a results line: a run is recorded when it finishes (a recorded run is not run again)
    results = out / "results.jsonl"
    lines = [l for l in results.read_text().splitlines() if (json.loads(l)["variant"], json.loads(l)["seed"]) != ("lite_ppo", 1)]
    assert len(lines) == 3
    results.write_text("\n".join(lines) + "\n")
    assert ablate.run_sweep(path, jobs=2, poll_s=0.2, exploratory=True) == 0
    assert [json.loads(l)["step"] for l in (cut / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert (cut / "DONE").exists() and "run.resume=auto" in (cut / "log.txt").read_text()
    assert {p: t for p, t in logs.items() if p.parent != cut} == {
        p: p.read_text() for p in out.glob("runs/*/*/log.txt") if p.parent != cut}


def test_the_plain_progress_writes_whole_lines_and_a_heartbeat(capsys, monkeypatch):
    from credo.ablate import scheduler

    clock = iter([0.0, 10.0, 400.0, 401.0])
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: next(clock))
    bar = scheduler.PlainSweepProgress("s", total=5, initial=1)  # reads the clock once: 0
    bar.set_postfix(running=2, failed=0)
    bar.refresh()  # 10 s: no line
    bar.update(1)
    bar.write("done   grpo/seed0 (3 s)")
    bar.refresh()  # 400 s: a heartbeat
    bar.refresh()  # 401 s: none (the last was 1 s ago)
    assert capsys.readouterr().err.splitlines() == ["done   grpo/seed0 (3 s) [2/5 runs]",
                                                    "ablate s: 2/5 runs finished, running 2, failed 0, 7 min"]
