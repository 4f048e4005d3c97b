"""`Trainer.fit`'s schedule and Ctrl-C paths, and what `train_step` hands its stages, on one quickstart trainer.

`fit` is driven with its own step, evaluation, checkpoint, export, tracker and reward close recorded (each test
swaps them on the module's trainer with monkeypatch), so its schedule is checked step by step in milliseconds;
tests/spine/test_trainer_steps.py runs the real ones end to end. The `train_step` tests run real steps and wrap the
stages the trainer calls to see the arguments and values passing through.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal

import pytest
import torch

import credo.trainer as tr
from credo.config import ConfigError, load_recipe
from credo.train.interrupt import RunInterrupted
from credo.train.state import TrainingError
from tests.e2e.common import tiny_overrides


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = tr.Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path_factory.mktemp("trainer-loop") / "run", **{"run.eval_every": 3, "run.steps": 3,
                                                            "task.eval_size": 4, "run.progress": True})))
    yield t
    t.close()


def test_the_progress_bar_starts_at_the_start_step(trainer):
    assert trainer.tracker.enabled and trainer.tracker.bar.n == trainer.start_step == 0
    assert trainer.tracker.bar.total == 3


# ----------------------------------------------------------------------------------------- fit, recorded
class Recorder:
    """Stands in for the trainer's step, evaluation, checkpoint, export, tracker and reward close."""

    def __init__(self, trainer, monkeypatch, *, steps, eval_every=0, save_every=0, start=0, on_step=None):
        self.steps, self.evals, self.saves, self.rows, self.exports, self.closed = [], [], [], [], [], []
        self.on_step = on_step or (lambda s: None)
        self.metric = trainer.c.evaluate.metric
        for k, v in dict(steps=steps, eval_every=eval_every, save_every=save_every).items():
            monkeypatch.setattr(trainer.c, k, v)
        monkeypatch.setattr(trainer, "start_step", start)
        monkeypatch.setattr(trainer, "train_step", self.train_step)
        monkeypatch.setattr(trainer, "evaluate", self.evaluate)
        monkeypatch.setattr(trainer, "checkpoint", self.saves.append)
        monkeypatch.setattr(trainer, "tracker", self)
        monkeypatch.setattr(trainer.reward, "close", lambda: self.closed.append("reward"))
        # the DeepSpeed engine's export (the trainer calls engine.export, which calls export_model)
        monkeypatch.setattr("credo.export.export_model", lambda *a, **kw: self.exports.append((a, kw)))

    def train_step(self, s):
        self.steps.append(s)
        self.on_step(s)
        return {"step": s, "train/x": float(s)}

    def evaluate(self):
        self.evals.append(self.steps[-1] if self.steps else 0)
        return 0.5

    def log(self, row):
        self.rows.append(dict(row))

    def close(self):
        self.closed.append("tracker")


def test_fit_evaluates_at_0_every_eval_every_and_last_saves_on_schedule_and_exports(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=5, eval_every=2, save_every=2)
    assert trainer.fit() == trainer.run_dir
    m = rec.metric
    assert rec.steps == [1, 2, 3, 4, 5] and rec.evals == [0, 2, 4, 5] and rec.saves == [2, 4, 5]
    assert rec.rows == [{"step": 0, m: 0.5}, {"step": 1, "train/x": 1.0}, {"step": 2, "train/x": 2.0, m: 0.5},
                        {"step": 3, "train/x": 3.0}, {"step": 4, "train/x": 4.0, m: 0.5},
                        {"step": 5, "train/x": 5.0, m: 0.5}]
    assert rec.exports == [((trainer.engine.module, trainer.c.tokenizer, trainer.run_dir / "final"),
                            {"zero_stage": trainer.c.zero_stage, "rank": 0})]
    assert sorted(rec.closed) == ["reward", "tracker"]


def test_fit_without_evaluation_or_periodic_saves_saves_the_last_step(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=3)
    trainer.fit()
    assert rec.steps == [1, 2, 3] and rec.evals == [] and rec.saves == [3]
    assert [r["step"] for r in rec.rows] == [1, 2, 3] and len(rec.exports) == 1


def test_fit_exports_with_the_engines_zero_stage(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=1)
    monkeypatch.setattr(trainer.engine, "zero_stage", 3)
    trainer.fit()
    assert rec.exports[0][1] == {"zero_stage": 3, "rank": 0}


def test_a_resumed_fit_goes_on_after_its_step_without_a_step_0_evaluation(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=5, eval_every=2, save_every=2, start=2)
    trainer.fit()
    assert rec.steps == [3, 4, 5] and rec.evals == [4, 5] and rec.saves == [4, 5] and len(rec.exports) == 1
    assert [r["step"] for r in rec.rows] == [3, 4, 5]


def test_a_fit_resumed_at_its_last_step_trains_and_exports_nothing(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=4, eval_every=2, save_every=2, start=4)
    assert trainer.fit() == trainer.run_dir
    assert (rec.steps, rec.evals, rec.saves, rec.rows, rec.exports) == ([], [], [], [], [])
    assert sorted(rec.closed) == ["reward", "tracker"]


def _ctrl_c(at):
    def on_step(s):
        if s == at:
            os.kill(os.getpid(), signal.SIGINT)  # fit's handler only records the first one

    return on_step


@pytest.mark.parametrize("at, save_every, expect", [
    (3, 2, (3, [2, 3])),  # step 3 finishes, is logged and checkpointed
    (2, 2, (2, [2])),  # step 2 was saved on schedule: not written twice
    (1, 0, (1, [1])),
])
def test_first_ctrl_c_checkpoints_the_finished_step_once(trainer, monkeypatch, caplog, at, save_every, expect):
    rec = Recorder(trainer, monkeypatch, steps=5, save_every=save_every, on_step=_ctrl_c(at))
    with caplog.at_level("WARNING", logger="credo"), pytest.raises(RunInterrupted) as e:
        trainer.fit()
    step, saves = expect
    assert (e.value.step, e.value.checkpoint, e.value.run_dir) == (step, saves[-1], trainer.run_dir)
    assert rec.steps == list(range(1, at + 1)) and [r["step"] for r in rec.rows] == rec.steps
    assert rec.saves == saves and rec.exports == [] and sorted(rec.closed) == ["reward", "tracker"]
    assert any(m.startswith("Ctrl-C: stopping after the step in progress") for m in caplog.messages)


def test_ctrl_c_during_the_last_step_completes_the_run(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=2, on_step=_ctrl_c(2))
    assert trainer.fit() == trainer.run_dir
    assert rec.saves == [2] and len(rec.exports) == 1


def test_ctrl_c_before_any_step_stops_without_a_checkpoint(trainer, monkeypatch):
    rec = Recorder(trainer, monkeypatch, steps=3, eval_every=3)
    evaluate = rec.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda: (os.kill(os.getpid(), signal.SIGINT), evaluate())[1])
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    assert (e.value.step, e.value.checkpoint) == (0, None) and rec.steps == [] and rec.saves == []
    assert str(e.value) == f"interrupted after step 0 (no checkpoint) in {trainer.run_dir}"


def test_ctrl_c_of_a_resumed_run_names_the_resumed_checkpoint(trainer, monkeypatch):
    def second_ctrl_c(s):
        raise KeyboardInterrupt

    rec = Recorder(trainer, monkeypatch, steps=5, start=3, on_step=second_ctrl_c)
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    assert (e.value.step, e.value.checkpoint) == (3, 3) and rec.saves == []


def test_second_ctrl_c_keeps_the_newest_checkpoint_on_disk(trainer, monkeypatch):
    def second_ctrl_c(s):
        if s == 3:
            raise KeyboardInterrupt

    rec = Recorder(trainer, monkeypatch, steps=5, save_every=2, on_step=second_ctrl_c)
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    assert (e.value.step, e.value.checkpoint, e.value.run_dir) == (2, 2, trainer.run_dir) and rec.saves == [2]
    assert [r["step"] for r in rec.rows] == [1, 2] and sorted(rec.closed) == ["reward", "tracker"]


@pytest.mark.parametrize("error", [RuntimeError("engine died"), TrainingError("too many skips"),
                                   ConfigError("bad key")])
def test_an_error_after_a_ctrl_c_stops_as_interrupted_unless_it_is_credos_own(trainer, monkeypatch, error):
    def fails_after_ctrl_c(s):
        if s == 2:
            os.kill(os.getpid(), signal.SIGINT)
            raise error

    rec = Recorder(trainer, monkeypatch, steps=5, on_step=fails_after_ctrl_c)
    if type(error) is RuntimeError:
        with pytest.raises(RunInterrupted) as e:
            trainer.fit()
        assert (e.value.step, e.value.checkpoint, e.value.run_dir) == (1, None, trainer.run_dir)
        assert e.value.__suppress_context__
    else:
        with pytest.raises(type(error), match=f"^{error}$"):
            trainer.fit()
    assert rec.saves == [] and sorted(rec.closed) == ["reward", "tracker"]


def test_an_error_without_a_ctrl_c_is_raised_as_it_is(trainer, monkeypatch):
    def fails(s):
        if s == 2:
            raise RuntimeError("engine died")

    rec = Recorder(trainer, monkeypatch, steps=5, on_step=fails)
    with pytest.raises(RuntimeError, match="^engine died$"):
        trainer.fit()
    assert rec.steps == [1, 2] and sorted(rec.closed) == ["reward", "tracker"]


def test_another_ranks_ctrl_c_stops_every_rank(trainer, monkeypatch):
    """Two ranks simulated: this rank saw no Ctrl-C, the all-reduce says another did."""
    monkeypatch.setattr(tr.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(tr.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(tr, "all_reduce_sum", lambda x: x + 1)
    monkeypatch.setattr(tr, "barrier", lambda: None)
    assert tr._any_rank(False) is True
    rec = Recorder(trainer, monkeypatch, steps=3)
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    assert (e.value.step, e.value.checkpoint) == (0, None) and rec.steps == []
    monkeypatch.setattr(tr, "all_reduce_sum", lambda x: x)
    assert tr._any_rank(False) is False and tr._any_rank(True) is True


def test_any_rank_in_a_world_of_one_is_the_flag(monkeypatch):
    monkeypatch.setattr(tr, "all_reduce_sum", lambda x: pytest.fail("no all-reduce in a world of one"))
    assert tr._any_rank(True) is True and tr._any_rank(False) is False
    monkeypatch.setattr(tr.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(tr.dist, "get_world_size", lambda: 1)
    assert tr._any_rank(True) is True and tr._any_rank(False) is False


# ------------------------------------------------------------------------------- train_step, real steps
class Hook:
    """A step hook that records what the trainer hands it, and when."""

    name = "recorded"

    def __init__(self):
        self.calls = []

    def before_step(self, step):
        self.calls.append(("before", step))

    def after_sync(self, step, batch):
        self.calls.append(("after", step, batch.step))
        return {"mipu/accepted": 1.0}


def test_train_step_hands_its_stages_the_model_the_step_and_the_settings(trainer, monkeypatch):
    hook, seen = Hook(), []
    monkeypatch.setattr(trainer.c, "hooks", [hook])
    monkeypatch.setattr(trainer.c, "overlong_filter", True)
    sync, recompute, pack = trainer.source.sync, trainer.scorer.recompute, tr.pack_batch
    monkeypatch.setattr(trainer.source, "sync", lambda model, s: (seen.append(("sync", model, s)), sync(model, s)))
    monkeypatch.setattr(trainer.scorer, "recompute",
                        lambda model, batch: (seen.append(("recompute", model, batch.step)), recompute(model, batch)))
    monkeypatch.setattr(tr, "pack_batch", lambda batch, pad, **kw: (seen.append(("pack", pad, kw)), pack(batch, pad,
                                                                                                           **kw)))
    row = trainer.train_step(7)
    module = trainer.engine.module
    assert seen == [("pack", trainer.c.tokenizer.pad_token_id, {"overlong_filter": True}), ("recompute", module, 7),
                    ("sync", module, 7)]
    assert hook.calls == [("before", 7), ("after", 7, 7)] and row["mipu/accepted"] == 1.0
    assert row["perf/recorded_s"] >= 0
    assert row["step"] == 7


def test_rollouts_of_another_rank_are_dumped_to_its_own_file(trainer, monkeypatch):
    monkeypatch.setattr(trainer.c, "dump_every", 3)
    monkeypatch.setattr(trainer.c, "rank", 1)
    dump = trainer.run_dir / "rollouts"
    trainer.train_step(10)
    assert not (dump / "step_10.rank1.jsonl").exists()
    trainer.train_step(9)
    assert (dump / "step_9.rank1.jsonl").is_file() and not (dump / "step_9.jsonl").exists()


@pytest.fixture
def counters(trainer):
    """The trainer's run counters, put back after the test."""
    saved = trainer.state.counters.state_dict()
    yield trainer.state.counters
    trainer.state.counters.load_state_dict(saved)


def test_reward_failures_are_counted_and_a_reward_models_own_metrics_logged(trainer, monkeypatch, counters):
    reward = trainer.reward

    class Failing:
        def __call__(self, batch):
            reward(batch)
            batch.metrics.update({"reward/failures": 2, "reward/timeouts": 1, "reward/unparseable_frac": 0.25})

    monkeypatch.setattr(trainer, "reward", Failing())
    before = counters.reward_failures_total
    row = trainer.train_step(1)
    assert (row["train/reward_failures"], row["train/reward_timeouts"], row["reward/unparseable_frac"]) == (2, 1, 0.25)
    assert "reward/failures" not in row and "reward/timeouts" not in row
    assert counters.reward_failures_total == before + 2


def test_skipped_update_steps_are_counted_in_the_steps_row(trainer, monkeypatch, counters):
    update = trainer.updater.update
    monkeypatch.setattr(trainer.updater, "update", lambda batch: (update(batch)[0], 2))
    counters.consecutive_skips = 0
    before = counters.skipped_total
    row = trainer.train_step(1)
    assert row["train/skipped_total"] == before + 2 == counters.skipped_total and counters.consecutive_skips == 1
    counters.consecutive_skips = trainer.state.max_consecutive_skips - 1
    with pytest.raises(TrainingError, match=r"; stopping at step 4$"):
        trainer.train_step(4)


# ------------------------------------------------------------------------------------------ step_metrics
def test_tokens_per_second_are_per_rank(trainer, monkeypatch):
    from credo.train.batch import pack_batch

    batch = trainer.source.rollout(1)
    trainer.reward(batch)
    pack_batch(batch, trainer.c.tokenizer.pad_token_id, overlong_filter=False)
    monkeypatch.setattr(trainer.c, "world", 2)
    batch.metrics = {}  # a reward that reports no failures or timeouts
    row = trainer.step_metrics(batch, {}, times=(0.0, 1.0, 2.0, 3.0, 4.0, 5.0))
    assert row["perf/tokens_per_s"] == pytest.approx(int(batch.attention_mask.sum()) / 5.0 / 2)
    assert row["train/reward_failures"] == 0 and row["train/reward_timeouts"] == 0


def test_peak_memory_is_the_processes_max_rss_or_the_gpus_peak(monkeypatch):
    import resource

    assert tr._peak_rss_gb() == pytest.approx(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, rel=0.1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 1024 ** 3)
    assert tr._peak_rss_gb() == 3.0


# -------------------------------------------------------------------------------------------- checkpoint
def test_checkpoint_records_the_weights_digest_and_keeps_the_last_n(trainer, monkeypatch):
    monkeypatch.setattr(trainer.c, "keep_last", 1)
    trainer.checkpoint(11)
    trainer.checkpoint(12)
    root = trainer.run_dir / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000012"]
    h = hashlib.sha256()
    for name, p in trainer.engine.module.named_parameters():
        h.update(name.encode() + p.detach().float().numpy().tobytes())
    assert json.loads((root / "step_00000012" / "meta.json").read_text())["param_digests"] == [h.hexdigest()]
