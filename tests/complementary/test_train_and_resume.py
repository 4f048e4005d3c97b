"""End to end: a Complementary RL run trains both models and fills its bank; the one-model mode trains the actor on
its own lessons; killed right after the step-2 checkpoint and resumed to step 4, a run (either mode) equals the
uninterrupted run (metrics.jsonl less perf/*, the actor's final parameters, the bank, and the second model's
parameters, bit for bit)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.common import read_rows, run_cli, tiny_overrides
from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok

pytestmark = pytest.mark.slow

STEPS = 4
LIMIT_S = 1800  # a run is about a minute on a free 2-core machine; the limit covers a shared one


def args(out, **extra) -> list[str]:
    o = {"run.steps": STEPS, "run.eval_every": 2, "run.save_every": 2, "run.keep_last": 3, "run.plot": False,
         "run.dump_rollouts_every": 0, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
         "env.eval_episodes": 8, "complementary.extractor_sft_steps": 20, "complementary.extractor_sft_batch": 8,
         "complementary.candidates": 3, "complementary.paired_episodes": 2,
         }
    o.update(extra)
    return ["run", "recipes/complementary.yaml", *tiny_overrides(out, **o)]


def test_a_run_trains_the_extractor_and_fills_the_bank(tmp_path):
    p = run_cli(args(tmp_path / "run", **{"run.steps": 3, "run.save_every": 3, "run.dump_rollouts_every": 3}),
                timeout=LIMIT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and "eval/return" in rows[-1]
    trained = rows[1:]
    # the first step starts from an empty bank: nothing is shown, and that is counted
    assert trained[0]["complementary/injected_frac"] == 0 and trained[0]["complementary/no_entry_frac"] == 1
    assert all(r["extractor/episodes"] == 2 and "extractor/loss" in r and r["env/failures"] == 0 for r in trained)
    assert trained[-1]["bank/size"] >= 1 and trained[-1]["complementary/bank_size"] >= 1
    ckpt = tmp_path / "run" / "checkpoints" / f"step_{3:08d}"
    meta = json.loads((ckpt / "meta.json").read_text())
    bank = meta["components"]["source"]["bank"]
    assert len(bank["entries"]) == trained[-1]["bank/size"] and bank["version"] >= 1
    assert (ckpt / "complementary" / "extractor").is_dir()
    dump = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_3.jsonl").read_text().splitlines()]
    shown = [d for d in dump if d["meta"]["experience"] is not None]
    assert all(d["prompt"].find("note: " + d["meta"]["experience"]["text"]) >= 0 for d in shown)


def test_one_model_mode_trains_the_actor_on_its_own_lessons_and_fills_the_bank(tmp_path):
    """complementary.extractor: self through the recipe: the actor's batch holds its lesson samples (reward = the
    paired gain, a group of their own), the update trains on them, the bank fills, and no second model exists."""
    run = tmp_path / "run"
    p = run_cli(args(run, **{"run.steps": 2, "run.save_every": 2, "run.dump_rollouts_every": 1,
                             "complementary.extractor": "self"}), timeout=LIMIT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "lesson warm-up of the actor" in p.stderr or "reusing the cached lesson warm-up" in p.stderr
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/return" in rows[-1]
    for step, r in zip((1, 2), rows[1:]):
        assert r["extractor/episodes"] == 2 and r["extractor/lesson_samples"] == 6 and r["train/grad_norm"] > 0
        assert "extractor/loss" not in r  # no second model's update
        dump = [json.loads(line) for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        lessons = [d for d in dump if "lesson" in d["meta"]]
        episodes = [d for d in dump if "lesson" not in d["meta"]]
        assert len(lessons) == 6 and len(episodes) == 16
        assert all(d["reward"] == d["meta"]["lesson"]["gain"] and d["trained"] for d in lessons)
        assert all(d["prompt"].endswith("lesson:") for d in lessons)
        assert not {d["group_id"] for d in lessons} & {d["group_id"] for d in episodes}
        gains = sorted({d["meta"]["lesson"]["gain"] for d in lessons})
        mean_gain = sum(d["reward"] for d in lessons) / 6
        assert r["extractor/reward_mean"] == pytest.approx(mean_gain, abs=1e-6)
        if len(gains) > 1:  # a lesson above its group's mean gain is pushed up: a nonzero advantage
            assert any(any(a != 0 for a in d["advantages"]) for d in lessons)
    assert rows[-1]["bank/size"] >= 1
    ckpt = run / "checkpoints" / f"step_{2:08d}"
    bank = json.loads((ckpt / "meta.json").read_text())["components"]["source"]["bank"]
    assert len(bank["entries"]) == rows[-1]["bank/size"]
    assert not (ckpt / "complementary").exists()


def extractor_params(run_dir, step):
    folder = run_dir / "checkpoints" / f"step_{step:08d}" / "complementary" / "extractor" / "state"
    state = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    return state["module"]


@pytest.mark.parametrize("extractor", ["model", "self"])
def test_sigkill_after_a_checkpoint_and_resume_is_exact(tmp_path, extractor):
    full, killed = tmp_path / "full", tmp_path / "killed"
    mode = {"complementary.extractor": extractor}
    wait_ok(start(args(full, **mode), tmp_path / "full.log"), timeout=LIMIT_S)
    run_and_kill(args(killed, **mode), has_checkpoint(killed, 2), tmp_path / "killed.log", timeout=LIMIT_S)
    assert not (killed / "checkpoints" / f"step_{STEPS:08d}").exists()
    err = wait_ok(start(args(killed, **mode, **{"run.resume": "auto"}), tmp_path / "resumed.log"), timeout=LIMIT_S)
    assert "resumed from" in err
    assert_same_run(full, killed, STEPS)
    banks = [json.loads((d / "checkpoints" / f"step_{STEPS:08d}" / "meta.json").read_text())["components"]["source"]
             for d in (full, killed)]
    assert banks[0] == banks[1] and banks[0]["bank"]["entries"]
    if extractor == "self":  # one model: the actor (checked above) is the extractor
        return
    a, b = extractor_params(full, STEPS), extractor_params(killed, STEPS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the extractor moved during RL: its step-4 weights differ from its step-2 weights
    early = extractor_params(full, 2)
    assert any(not torch.equal(early[k], a[k]) for k in a)
