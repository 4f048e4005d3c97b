"""credo.simulate's inputs and front ends: length fitting from dumps, cost fitting, scenario files, the CLI."""

import json
import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("simpy")

from credo.simulate.calibrate import fit_decode, fit_train  # noqa: E402
from credo.simulate.cli import main  # noqa: E402
from credo.simulate.lengths import LengthModel, draw_prompt, draw_responses, fit_dumps, quantiles  # noqa: E402


def _write_dump(path: Path, step: int, groups: list[list[int]], prompt_len: int = 5):
    with open(path, "w") as f:
        for g, lengths in enumerate(groups):
            for n in lengths:
                f.write(json.dumps({"step": step, "index": 0, "group_id": g, "prompt_ids": [7] * prompt_len,
                                    "response_ids": [9] * n, "response_mask": [1] * n, "reward": 0.0}) + "\n")


def test_fit_dumps_groups_by_step_and_group(tmp_path):
    (tmp_path / "rollouts").mkdir()
    _write_dump(tmp_path / "rollouts" / "step_1.jsonl", 1, [[10, 12], [100, 80]])
    _write_dump(tmp_path / "rollouts" / "step_2.jsonl", 2, [[30, 30]], prompt_len=9)
    m = fit_dumps(sorted((tmp_path / "rollouts").glob("*.jsonl")))
    assert sorted(map(sorted, m.groups)) == [[10, 12], [30, 30], [80, 100]]
    assert m.median == statistics.median([10, 12, 100, 80, 30, 30])
    means = [statistics.fmean(map(math.log, g)) for g in ([10, 12], [100, 80], [30, 30])]
    assert m.sigma_prompt == pytest.approx(statistics.pstdev(means))
    within = sum((math.log(x) - mu) ** 2 for g, mu in zip(([10, 12], [100, 80], [30, 30]), means) for x in g) / 3
    assert m.sigma_response == pytest.approx(math.sqrt(within))
    assert m.prompt_len == round((5 + 5 + 9) / 3) and (m.min_len, m.max_len) == (10, 100)


def test_fit_dumps_names_the_bad_line(tmp_path):
    p = tmp_path / "step_1.jsonl"
    p.write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match=r"step_1.jsonl:1: not a rollout dump row"):
        fit_dumps([p])


def test_lognormal_draws_have_the_asked_median_and_spreads():
    m = LengthModel(kind="lognormal", median=300, sigma_prompt=0.9, sigma_response=0.4, min_len=1, max_len=10**7)
    rng = random.Random(0)
    ids = [draw_prompt(m, rng) for _ in range(3000)]
    groups = [draw_responses(m, i, 4, rng) for i in ids]
    logs = np.log(np.array(groups, dtype=float))
    assert np.exp(np.median(logs)) == pytest.approx(300, rel=0.06)
    assert logs.mean(1).std() == pytest.approx(math.sqrt(0.9 ** 2 + 0.4 ** 2 / 4), rel=0.06)
    assert np.sqrt(((logs - logs.mean(1, keepdims=True)) ** 2).sum() / (3000 * 3)) == pytest.approx(0.4, rel=0.06)
    q = quantiles([x for g in groups for x in g])
    assert q[0.99] / q[0.5] > 5  # long-tailed


def test_fit_decode_recovers_known_costs():
    truth = dict(prefill_s=0.05, prefill_token_s=2e-5, decode_step_s=0.004, decode_seq_s=6e-5, decode_ctx_s=3e-8)
    rows = []
    for b in (8, 32, 128):
        for n in (16, 64, 256):
            p = 20
            t = (truth["prefill_s"] + truth["prefill_token_s"] * b * p)
            t += sum(truth["decode_step_s"] + truth["decode_seq_s"] * b + truth["decode_ctx_s"] * b * (p + s)
                     for s in range(n))
            rows.append((b, p, n, t))
    got = fit_decode(rows)
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k


def test_fit_train_regresses_cost_on_padded_tokens():
    steps = []
    for step, width in enumerate([20, 40, 80, 160], start=1):
        tokens = 64 * width
        steps.append({"step": step, "pairs": [(4, width - 4)] * 64,
                      "metrics": {"perf/logprob_s": 0.1 + 1e-5 * tokens, "perf/update_s": 0.2 + 2e-5 * tokens,
                                  "perf/reward_s": 64 * 1e-4, "perf/sync_s": 0.0}})
    got = fit_train(steps, skip_first=False)
    assert got["train_fixed_s"] == pytest.approx(0.3) and got["train_token_s"] == pytest.approx(3e-5)
    assert got["reward_sample_s"] == pytest.approx(1e-4) and got["sync_s"] == 0.0


SCENARIO = """
name: tiny
steps: 4
baseline: sync
workload:
  prompts_per_step: 4
  group_size: 2
  lengths: {kind: lognormal, median: 50, sigma_prompt: 1.0, sigma_response: 0.2, max_len: 512, prompt_len: 16}
costs: {decode_step_s: 0.01, decode_seq_s: 0.0001, train_fixed_s: 0.5}
modes:
  - {name: sync, mode: sync, devices: 2, max_batch: 16}
  - {name: tail, mode: tail_batching, devices: 2, max_batch: 16}
"""


def test_cli_run_writes_table_plot_and_json(tmp_path, capsys):
    scn = tmp_path / "s.yaml"
    scn.write_text(SCENARIO)
    assert main(["run", str(scn), "--out", str(tmp_path / "out"), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| sync | sync |" in out and "| tail | tail_batching |" in out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["name"] for r in rows] == ["sync", "tail"] and rows[0]["speedup"] == 1.0
    assert (tmp_path / "out" / "plot.png").stat().st_size > 1000


def test_cli_reports_a_bad_scenario_key(tmp_path, capsys):
    scn = tmp_path / "s.yaml"
    scn.write_text(SCENARIO.replace("max_batch: 16}\n  - {name: tail", "max_batch: 16, colour: red}\n  - {name: tail"))
    assert main(["run", str(scn)]) == 1
    assert "modes[0].colour is not a key" in capsys.readouterr().err


def test_cli_fit_prints_quantiles(tmp_path, capsys):
    (tmp_path / "rollouts").mkdir()
    _write_dump(tmp_path / "rollouts" / "step_1.jsonl", 1, [[10, 12], [100, 80]])
    assert main(["fit", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 responses in 2 prompt groups" in out and "| tokens | 10 |" in out


def test_shipped_scenarios_load():
    from credo.simulate.scenario import load_scenario

    files = sorted(Path(__file__).resolve().parents[2].joinpath("benchmarks", "simulate").glob("*.yaml"))
    assert files, "benchmarks/simulate/*.yaml"
    for f in files:
        scn = load_scenario(f)
        assert scn.baseline in [m.name for m in scn.modes], f


def test_empirical_draws_keep_a_groups_longest():
    m = LengthModel(kind="empirical", groups=[[5, 9, 400, 12]], max_len=1000)
    rng = random.Random(1)
    for _ in range(50):
        assert sorted(draw_responses(m, draw_prompt(m, rng), 4, rng)) == [5, 9, 12, 400]
    more = draw_responses(m, 0, 7, rng)
    assert len(more) == 7 and set(more) <= {5, 9, 12, 400} and 400 in more
