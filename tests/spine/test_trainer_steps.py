"""The trainer loop in this process (fast): one quickstart `Trainer` built once, its `train_step` row,
rollout dumps, checkpoint meta and every path of `TrainState.resume`, and `fit`'s second Ctrl-C.

The slow tests (tests/spine/test_stages.py, tests/reliability, the CLI) cover the same code through whole
runs; these run a step in a few hundredths of a second on the module's one trainer, so mutation testing
sees them.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import time

import pytest
import torch

from credo.config import ConfigError, load_recipe
from tests.e2e.common import tiny_overrides


def _build_trainer(out):
    from credo.trainer import Trainer

    return Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        out / "run", **{"run.eval_every": 0, "run.steps": 3, "run.dump_rollouts_every": 2})))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = _build_trainer(tmp_path_factory.mktemp("trainer-steps"))
    yield t
    t.close()


def test_rollouts_are_dumped_on_multiples_of_dump_every_as_rank0_files(trainer):
    dump_dir = trainer.run_dir / "rollouts"
    trainer.train_step(1)
    assert not dump_dir.exists() or not any(dump_dir.iterdir()), "step 1 is no multiple of dump_rollouts_every=2"
    row = trainer.train_step(2)
    assert sorted(p.name for p in dump_dir.iterdir()) == ["step_2.jsonl"]
    rows = [json.loads(x) for x in (dump_dir / "step_2.jsonl").read_text().splitlines()]
    assert len(rows) == 16
    tok = trainer.c.tokenizer
    for d in rows:
        assert d["response"] == tok.decode(d["response_ids"], skip_special_tokens=False)
        assert d["trained"] is True  # no overlong filter here: every sample with a response is trained on
        assert len(d["advantages"]) == len(d["response_ids"])
        assert all(isinstance(a, float) for a in d["advantages"])
    rewards = torch.tensor([d["reward"] for d in rows])
    assert float(rewards.mean()) == pytest.approx(row["train/reward_mean"], abs=1e-6)
    # GRPO-style outcome advantages: each sample's advantage sign follows its reward against its group's mean
    for d in rows:
        group = [e["reward"] for e in rows if e["group_id"] == d["group_id"]]
        dev = d["reward"] - sum(group) / len(group)
        if abs(dev) > 1e-6:
            assert all(math.copysign(1, a) == math.copysign(1, dev) for a in d["advantages"] if a != 0)


class _SlowHook:
    """A step hook: the trainer times its before_step and after_sync as perf/<name>_s."""

    name = "slow"

    def before_step(self, step):
        time.sleep(0.01)

    def after_sync(self, step, batch):
        time.sleep(0.01)
        return {}


def test_step_row_timings_add_up(trainer, monkeypatch):
    monkeypatch.setattr(trainer.c, "hooks", [_SlowHook()])
    t = time.perf_counter()
    row = trainer.train_step(1)
    wall = time.perf_counter() - t
    parts = [row[f"perf/{k}_s"] for k in ("rollout", "reward", "logprob", "update", "sync")]
    assert all(0 <= p <= wall for p in parts)
    assert sum(parts) == pytest.approx(row["perf/step_time_s"], abs=1e-6)
    assert row["perf/train_s"] == pytest.approx(row["perf/logprob_s"] + row["perf/update_s"], abs=1e-6)
    # the hook's two calls, each slept 10 ms, and nothing of the step between them
    assert 0.02 <= row["perf/slow_s"] <= wall - row["perf/step_time_s"] + 1e-6


def _packed_batch(trainer, step):
    """The step's batch up to the advantage, as `train_step` makes it."""
    from credo.train.batch import pack_batch

    batch = trainer.source.rollout(step)
    trainer.reward(batch)
    pack_batch(batch, trainer.c.tokenizer.pad_token_id, overlong_filter=trainer.c.overlong_filter)
    return batch


def test_step_metrics_reads_the_rewards_lengths_and_stage_times(trainer):
    batch = _packed_batch(trainer, 1)
    times = (10.0, 11.0, 13.0, 16.0, 20.0, 25.0)  # t0, rollout, reward, logprob, update, sync
    row = trainer.step_metrics(batch, {"loss/x": 0.5}, times=times)
    valid = batch.rewards[batch.valid]
    assert row["step"] == 1 and row["loss/x"] == 0.5
    assert row["train/reward_mean"] == pytest.approx(float(valid.mean()))
    assert row["train/reward_std"] == pytest.approx(float(valid.std()))
    lengths = [len(s.response_ids) for s in batch.samples]
    assert row["train/response_len"] == pytest.approx(sum(lengths) / len(lengths))
    assert row["train/truncated_frac"] == pytest.approx(sum(not s.finished for s in batch.samples) / len(lengths))
    assert row["train/reward_failures"] == batch.metrics.get("reward/failures", 0)
    assert row["train/reward_timeouts"] == batch.metrics.get("reward/timeouts", 0)
    assert row["train/skipped_total"] == trainer.state.counters.skipped_total
    assert row["train/lr"] == trainer.engine.get_lr()[0]
    assert {k: row[f"perf/{k}_s"] for k in ("rollout", "reward", "logprob", "update", "sync", "train", "step_time")} == \
        {"rollout": 1.0, "reward": 2.0, "logprob": 3.0, "update": 4.0, "sync": 5.0, "train": 7.0, "step_time": 15.0}
    assert row["perf/tokens_per_s"] == pytest.approx(int(batch.attention_mask.sum()) / 15.0)
    assert 0 < row["perf/peak_rss_gb"] < 1024
    # one valid sample has no spread; none has no mean
    batch.valid = torch.zeros_like(batch.valid)
    batch.valid[3] = True
    row = trainer.step_metrics(batch, {}, times=times)
    assert row["train/reward_std"] == 0.0 and row["train/reward_mean"] == float(batch.rewards[3])
    batch.valid[3] = False
    row = trainer.step_metrics(batch, {}, times=times)
    assert row["train/reward_std"] == 0.0 and math.isnan(row["train/reward_mean"])


def test_step_row_names_are_lower_case_namespaced(trainer):
    row = trainer.train_step(1)
    assert [k for k in row if k != "step" and not re.fullmatch(r"[a-z0-9_]+/[a-z0-9_]+", k)] == []
    # no step hook (quickstart), so no hook time; the update's terms and the run counters are in the row
    assert trainer.c.hooks == [] and "perf/mipu_s" not in row
    assert row["step"] == 1 and row["train/skipped_total"] == trainer.state.counters.skipped_total
    assert {"train/loss", "train/pg_loss", "train/grad_norm", "train/reward_mean", "perf/step_time_s"} <= set(row)


def test_step_without_a_policy_update_is_not_a_skipped_step(trainer, monkeypatch):
    rollout = trainer.source.rollout

    def no_policy(step):
        batch = rollout(step)
        batch.train_policy = False
        return batch

    monkeypatch.setattr(trainer.source, "rollout", no_policy)
    before = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
    total = trainer.state.counters.skipped_total
    row = trainer.train_step(1)
    assert all(torch.equal(before[k], v) for k, v in trainer.engine.module.named_parameters())
    assert row["train/skipped_total"] == total and trainer.state.counters.consecutive_skips == 0
    assert "train/loss" not in row


def test_two_identical_ranks_report_the_metrics_of_one(trainer, monkeypatch):
    """Data parallel in one process: world=2 with every all-reduce doubling (two ranks holding the same shard) takes
    the same update and reports the same loss terms and loss-metric means as world=1."""
    import credo.train.update as upd

    def params():
        return {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}

    snap = trainer.state.snapshot()
    one = trainer.train_step(1)
    after_one = params()
    trainer.state.restore(snap)
    monkeypatch.setattr(trainer.updater, "world", 2)
    monkeypatch.setattr(upd, "all_reduce_sum", lambda x: x * 2)
    two = trainer.train_step(1)
    after_two = params()
    trainer.state.restore(snap)
    keys = [k for k in one if k.startswith("loss/") or k in ("train/pg_loss", "train/entropy", "train/loss")]
    assert any(k.startswith("loss/") for k in keys)
    assert {k: two[k] for k in keys} == pytest.approx({k: one[k] for k in keys}, rel=1e-5, abs=1e-7)
    diffs = {k: float((v - after_one[k]).abs().max()) for k, v in after_two.items()}
    assert max(diffs.values()) < 1e-6, diffs


# ------------------------------------------------------------------------------ checkpoint and resume
@pytest.fixture(scope="module")
def saved(trainer):
    """A checkpoint of step 2."""
    trainer.checkpoint(2)
    return trainer.run_dir / "checkpoints" / "step_00000002"


def test_checkpoint_meta_holds_what_resume_and_export_read(trainer, saved):
    trainer.checkpoint(2)  # written again in the test itself (mutation testing maps tests to what their body calls)
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["policy_path"] == trainer.state.policy_path and meta["policy_path"]
    assert meta["config"]["optim"]["lr"] == 1e-3 and meta["config"]["run"]["steps"] == 3
    assert meta["sft_key"] == trainer.state.sft_key
    # the stages with a state (here: stateless source and advantage) are saved with it
    assert set(meta["components"]) == {"source", "advantage"}


def test_resume_auto_and_by_path_load_the_checkpoint(trainer, saved, tmp_path, caplog):
    s = trainer.state
    with caplog.at_level(logging.INFO, logger="credo"):
        assert s.resume("auto", trainer.run_dir, rank=0, world=1, allow_config_change=False) == 2
    assert f"resumed from {saved} (step 2)" in [r.getMessage() for r in caplog.records]
    # a named folder; the metrics of the steps after it are dropped from this run_dir's metrics.jsonl
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "x": i}) + "\n" for i in range(1, 5)))
    assert s.resume(str(saved), tmp_path, rank=0, world=1, allow_config_change=False) == 2
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_rejects_a_changed_config_naming_the_key(trainer, saved, monkeypatch):
    s = trainer.state
    config = json.loads(json.dumps(s.config))
    config["optim"]["lr"] = 5e-4
    monkeypatch.setattr(s, "config", config)
    with pytest.raises(ConfigError, match=r"optim\.lr: 0\.001 -> 0\.0005"):
        s.resume(str(saved), trainer.run_dir, rank=0, world=1, allow_config_change=False)


def test_resume_auto_without_a_checkpoint_starts_at_0_and_says_so(trainer, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="credo"):
        assert trainer.state.resume("auto", tmp_path, rank=0, world=1, allow_config_change=False) == 0
    assert f"run.resume=auto: no usable checkpoint in {tmp_path / 'checkpoints'}; starting from step 0" in \
        [r.getMessage() for r in caplog.records]


def test_load_checkpoint_without_this_ranks_rng_names_the_folder(trainer, saved, tmp_path, caplog):
    from credo.checkpoint import load_checkpoint

    copy = tmp_path / "step_00000002"
    shutil.copytree(saved, copy)
    (copy / "rng_rank0.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="credo"):
        meta = load_checkpoint(trainer.engine, copy, verify=False)
    assert meta["step"] == 2
    assert f"checkpoint {copy} has no RNG state for rank 0; this rank keeps its fresh RNG" in \
        [r.getMessage() for r in caplog.records]


def test_second_ctrl_c_reports_the_last_finished_step(tmp_path, monkeypatch):
    """On a trainer of its own: `fit` closes the tracker and the reward, and tests may run in any order (mutmut
    orders them by itself; a shared trainer closed here hung the next test's reward call)."""
    from credo.train.interrupt import RunInterrupted

    trainer = _build_trainer(tmp_path)

    step = trainer.train_step

    def interrupted_at_2(s):
        if s == 2:
            raise KeyboardInterrupt
        return step(s)

    monkeypatch.setattr(trainer, "train_step", interrupted_at_2)
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    assert e.value.step == 1 and e.value.checkpoint is None


def test_first_ctrl_c_checkpoints_the_finished_step_and_resume_auto_goes_on_from_it(tmp_path, monkeypatch):
    """On trainers of their own (see above). The first Ctrl-C lets step 2 finish, checkpoints it and stops; a
    trainer built with run.resume=auto on that folder starts at step 2 and syncs its rollout engine for step 2."""
    import os
    import signal

    from credo.train.interrupt import RunInterrupted
    from credo.trainer import Trainer

    trainer = _build_trainer(tmp_path)
    step = trainer.train_step

    def ctrl_c_during_2(s):
        row = step(s)
        if s == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: fit's handler only records it
        return row

    monkeypatch.setattr(trainer, "train_step", ctrl_c_during_2)
    with pytest.raises(RunInterrupted) as e:
        trainer.fit()
    trainer.close()
    assert (e.value.step, e.value.checkpoint) == (2, 2)
    assert (trainer.run_dir / "checkpoints" / "step_00000002" / "meta.json").exists()

    synced = []
    source_class = type(trainer.source)
    sync = source_class.sync
    monkeypatch.setattr(source_class, "sync", lambda self, model, s: (synced.append(s), sync(self, model, s))[1])
    first_config = (trainer.run_dir / "config.yaml").read_text()
    resumed = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path / "run", **{"run.eval_every": 0, "run.steps": 3, "run.dump_rollouts_every": 2, "run.resume": "auto",
                             "run.allow_config_change": True, "optim.lr": 5e-4})))
    try:
        assert resumed.start_step == 2 and synced == [2]
        # the changed setting is accepted and its config written beside the first segment's
        assert resumed.state.config_changed == {"optim.lr": (1e-3, 5e-4)}
        assert (resumed.run_dir / "config.yaml").read_text() == first_config
        assert "lr: 0.0005" in (resumed.run_dir / "config.resume-2.yaml").read_text()
    finally:
        resumed.close()


def test_fit_evaluates_checkpoints_and_exports_on_schedule(tmp_path):
    """`train` end to end in this process: the step-0 evaluation, evaluations every eval_every steps and at the last
    step, checkpoints every save_every steps and at the last step, the exported policy."""
    from credo.trainer import train
    from tests.e2e.common import read_rows

    run_dir = train(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path / "run", **{"run.eval_every": 2, "run.save_every": 2, "run.steps": 3, "run.plot": False,
                              "task.eval_size": 4})))
    assert run_dir == tmp_path / "run"
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert ["eval/accuracy" in r for r in rows] == [True, False, True, True]
    assert all(0 <= r["eval/accuracy"] <= 1 for r in rows if "eval/accuracy" in r)
    assert [p.name for p in sorted((run_dir / "checkpoints").glob("step_*"))] == ["step_00000002", "step_00000003"]
    assert (run_dir / "final" / "config.json").exists() and (run_dir / "config.yaml").exists()
