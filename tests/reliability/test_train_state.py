"""`TrainState` in this process on a tiny DeepSpeed engine: the run counters, the checkpoint's meta, the refusals to
save, every path of `resume`, and `config_changes`.

The slow tests (tests/reliability/test_resume*.py, the CLI) cover the same code through whole runs in subprocesses;
these take a few seconds and run in-process, so mutation testing sees them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pytest
import torch

from credo.checkpoint import list_checkpoints
from credo.config import ConfigError, Recipe, recipe_class
from credo.train.state import (RESUME_FREE_KEYS, Counters, TrainingError, TrainState, _flatten, _free_name,
                               config_changes)

CONFIG = {"optim": {"lr": 1.0, "betas": [0.9, 0.99]}, "run": {"steps": 3, "seed": 0},
          "algo": {"loss_kwargs": {"clip": 0.2}}}


@pytest.fixture(scope="module")
def make_engine():
    from credo.distributed.engine import build_engine, setup_distributed

    setup_distributed()

    def make(seed: int = 0):
        torch.manual_seed(seed)
        return build_engine(torch.nn.Linear(4, 3), lr=1e-2, betas=[0.9, 0.999], weight_decay=0.0, grad_clip=1.0,
                            zero_stage=1, warmup_steps=10, micro_batch=2, grad_accum=1, bf16=False)

    return make


class Position:
    """A stage whose state is JSON (saved in meta.json)."""

    def __init__(self):
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


class Tensors:
    """A stage that saves itself as files in the checkpoint folder (as the critics do)."""

    def __init__(self):
        self.value = torch.zeros(2)

    def state_dict(self):
        return {"value": self.value.clone()}

    def load_state_dict(self, state):
        self.value = state["value"].clone()

    def save_files(self, folder):
        folder.mkdir(parents=True)
        torch.save(self.value, folder / "value.pt")
        return {"entries": 2}

    def load_files(self, folder):
        self.value = torch.load(folder / "value.pt")


def make_state(engine, *, config=None, sft_key="sft-1", max_skips=3) -> TrainState:
    return TrainState(engine, {"source": Position(), "critic": Tensors()}, config=json.loads(json.dumps(config or CONFIG)),
                      sft_key=sft_key, policy_path="/policy", max_consecutive_skips=max_skips)


def saved_state(engine, root, step=4):
    """A state with counters and stage states of its own, saved at `step` under root/checkpoints."""
    s = make_state(engine)
    s.counters.load_state_dict({"consecutive_skips": 1, "skipped_total": 2, "reward_failures_total": 5})
    s.components["source"].pos = 7
    s.components["critic"].value = torch.tensor([1.5, -2.0])
    s.save(root / "checkpoints", step, keep_last=2, param_digests=["d0", "d0"])
    return s, root / "checkpoints" / f"step_{step:08d}"


def test_counters_count_skips_and_reward_failures_and_stop_at_the_cap(make_engine):
    s = make_state(make_engine(), max_skips=3)
    assert s.counters == Counters(0, 0, 0) and s.components["counters"] is s.counters
    s.record_step(1, 2, 1)
    s.record_step(1, 0, 2)
    assert (s.counters.consecutive_skips, s.counters.skipped_total, s.counters.reward_failures_total) == (2, 2, 2)
    s.record_step(0, 3, 3)  # an applied step ends the streak, not the totals
    assert (s.counters.consecutive_skips, s.counters.skipped_total, s.counters.reward_failures_total) == (0, 2, 5)
    s.record_step(2, 0, 4)  # a step counts its skipped mini-batch steps, the streak counts steps
    s.record_step(1, 0, 5)
    assert (s.counters.consecutive_skips, s.counters.skipped_total) == (2, 5)
    with pytest.raises(TrainingError, match=r"^3 consecutive optimizer steps skipped for non-finite values "
                                            r"\(run.max_consecutive_skips=3\); stopping at step 6$"):
        s.record_step(1, 0, 6)
    assert Counters(1, 2, 3).state_dict() == {"consecutive_skips": 1, "skipped_total": 2, "reward_failures_total": 3,
                                              "consecutive_empty": 0}


def test_steps_with_nothing_to_train_stop_the_run_with_the_reason(make_engine):
    s = make_state(make_engine(), max_skips=2)
    s.record_step(0, 0, 1, empty="no sample has a token to train on: 0 of 8 have a valid reward")
    s.record_step(0, 0, 2)  # a step that trains ends the streak
    s.record_step(0, 0, 3, empty="why 3")
    assert s.counters.consecutive_empty == 1 and s.counters.consecutive_skips == 0
    with pytest.raises(TrainingError, match=r"^2 consecutive steps had nothing to train on \(run.max_consecutive_skips"
                                            r"=2\); stopping at step 4. Step 4: env/overflow_frac = 1.0$"):
        s.record_step(0, 0, 4, empty="env/overflow_frac = 1.0")


def test_nothing_to_train_names_what_emptied_the_batch():
    from credo.train.batch import Batch
    from credo.trainer import nothing_to_train

    b = Batch(samples=[None] * 3, problems=[None] * 3, group_ids=torch.arange(3))
    b.loss_mask = torch.zeros(3, 4, dtype=torch.bool)
    b.response_mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    b.valid, b.finished = torch.tensor([False, True, False]), torch.tensor([True, False, False])
    b.metrics = {"env/overflow_frac": 1.0, "env/terminated_frac": 0.5}
    assert nothing_to_train(b) == ("no sample has a token to train on: 1 of 3 have a valid reward, 2 have a response "
                                   "token, 1 ended before the length cap; env/overflow_frac = 1.0")
    b.loss_mask[2, 0] = True
    assert nothing_to_train(b) is None


class Log:
    """A stage whose state_dict hands out its live list (snapshot and restore must copy it)."""

    def __init__(self):
        self.seen = []

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def test_snapshot_and_restore_are_copies(make_engine):
    s = make_state(make_engine())
    s.components["log"] = log = Log()
    log.seen.append(1)
    s.components["source"].pos = 3
    s.counters.skipped_total = 1
    weight = s.engine.module.weight.detach().clone()
    snap = s.snapshot()
    assert snap["source"] == {"pos": 3} and snap["counters"]["skipped_total"] == 1
    assert set(snap) == {"engine", "rng", "counters", "source", "critic", "log"}
    log.seen.append(2)  # a step after the snapshot
    s.components["source"].pos = 9
    s.counters.skipped_total = 4
    s.components["critic"].value += 1
    with torch.no_grad():
        s.engine.module.weight.add_(1.0)
    s.restore(snap)
    assert s.components["source"].pos == 3 and s.counters.skipped_total == 1
    assert torch.equal(s.components["critic"].value, torch.zeros(2))
    assert torch.equal(s.engine.module.weight, weight)
    assert log.seen == [1]
    s.counters.skipped_total = 6
    log.seen.append(3)
    s.restore(snap)  # a snapshot restores again: restoring did not hand the snapshot's objects out
    assert s.counters.skipped_total == 1 and log.seen == [1]


def test_save_writes_what_resume_and_export_read(make_engine, tmp_path):
    s, folder = saved_state(make_engine(), tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["step"] == 4 and meta["data_position"] == 4
    assert (meta["sft_key"], meta["policy_path"], meta["param_digests"]) == ("sft-1", "/policy", ["d0", "d0"])
    assert meta["config"] == CONFIG
    # JSON stages in meta.json; stages with tensors in folders of their own, what they return in component_files
    assert meta["components"] == {"source": {"pos": 7}}
    assert meta["counters"] == {"consecutive_skips": 1, "skipped_total": 2, "reward_failures_total": 5,
                                "consecutive_empty": 0}
    assert meta["component_files"] == {"critic": {"entries": 2}}
    assert torch.equal(torch.load(folder / "critic" / "value.pt"), torch.tensor([1.5, -2.0]))


def test_save_of_a_state_without_file_stages_has_no_component_files(make_engine, tmp_path):
    s = TrainState(make_engine(), {"source": Position()}, config=CONFIG, sft_key=None, policy_path="/p",
                   max_consecutive_skips=3)
    s.save(tmp_path, 1, keep_last=1, param_digests=["d"])
    meta = json.loads((tmp_path / "step_00000001" / "meta.json").read_text())
    assert "component_files" not in meta and meta["components"] == {"source": {"pos": 0}} and meta["sft_key"] is None


def test_save_refuses_diverged_ranks_and_a_non_finite_model(make_engine, tmp_path):
    s = make_state(make_engine())
    with pytest.raises(TrainingError, match=r"^data-parallel ranks hold different parameters at step 4: \['a', 'b'\]$"):
        s.save(tmp_path, 4, keep_last=2, param_digests=["a", "b"])
    with torch.no_grad():
        s.engine.module.weight[0, 0] = float("nan")
    with pytest.raises(TrainingError, match=r"^the model holds non-finite parameters at step 5; no checkpoint written\. "
                                            r"Resume from the last checkpoint \(run.resume=auto\) with a lower optim.lr$"):
        s.save(tmp_path, 5, keep_last=2, param_digests=["a"])
    assert list_checkpoints(tmp_path) == []


def test_resume_by_path_loads_every_part_and_truncates_the_metrics(make_engine, tmp_path, caplog):
    engine = make_engine(0)
    _, folder = saved_state(engine, tmp_path)
    weight = engine.module.weight.detach().clone()
    other = make_state(make_engine(1))
    run_dir = tmp_path / "other"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(1, 7)))
    with caplog.at_level(logging.INFO, logger="credo"):
        assert other.resume(str(folder), run_dir, rank=0, world=1, allow_config_change=False) == 4
    assert f"resumed from {folder} (step 4)" in caplog.messages
    assert torch.equal(other.engine.module.weight, weight)
    assert other.counters == Counters(1, 2, 5) and other.components["source"].pos == 7
    assert torch.equal(other.components["critic"].value, torch.tensor([1.5, -2.0]))
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert other.config_changed == {}


def test_resume_on_another_rank_leaves_the_metrics_to_rank_0(make_engine, tmp_path):
    _, folder = saved_state(make_engine(), tmp_path)
    rows = "".join(json.dumps({"step": i}) + "\n" for i in range(1, 7))
    (tmp_path / "metrics.jsonl").write_text(rows)
    assert make_state(make_engine(1)).resume(str(folder), tmp_path, rank=1, world=1, allow_config_change=False) == 4
    assert (tmp_path / "metrics.jsonl").read_text() == rows


def test_resume_auto_takes_the_newest_checkpoint(make_engine, tmp_path):
    engine = make_engine()
    s, _ = saved_state(engine, tmp_path, step=2)
    s.components["source"].pos = 8
    s.save(tmp_path / "checkpoints", 6, keep_last=3, param_digests=["d"])
    other = make_state(make_engine(1))
    assert other.resume("auto", tmp_path, rank=0, world=1, allow_config_change=False) == 6
    assert other.components["source"].pos == 8
    # rank 0 tidies: a corrupt newest checkpoint is set aside (and the one before it loaded), a torn write removed
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_00000006" / "meta.json").write_text("{}")
    (ckpts / ".tmp-step_00000007").mkdir()
    assert other.resume("auto", tmp_path, rank=0, world=1, allow_config_change=False) == 2
    assert sorted(p.name for p in ckpts.iterdir()) == ["corrupt-step_00000006", "step_00000002"]


def test_resume_auto_on_another_rank_loads_the_folder_rank_0_chose(make_engine, tmp_path, monkeypatch):
    import credo.train.state as st

    _, folder = saved_state(make_engine(), tmp_path, step=3)
    searched = []
    monkeypatch.setattr(st, "find_resume_checkpoint", lambda root, tidy=False: searched.append(tidy) or folder)

    sent = []

    def broadcast_from_rank_0(found, src):
        sent.append((list(found), src))
        found[0] = folder

    monkeypatch.setattr(st.dist, "broadcast_object_list", broadcast_from_rank_0)
    assert make_state(make_engine(1)).resume("auto", tmp_path, rank=1, world=2, allow_config_change=False) == 3
    assert searched == [] and sent == [([None], 0)]  # only rank 0 verifies and tidies the folders
    assert make_state(make_engine(1)).resume("auto", tmp_path, rank=0, world=2, allow_config_change=False) == 3
    assert searched == [True] and sent[1] == ([folder], 0)


@pytest.mark.parametrize("spec", [None, ""])
def test_no_resume_starts_at_0_and_touches_nothing(make_engine, tmp_path, spec):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert make_state(make_engine()).resume(spec, tmp_path, rank=0, world=1, allow_config_change=False) == 0
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_resume_auto_without_a_checkpoint_moves_the_old_metrics_aside(make_engine, tmp_path, caplog):
    s = make_state(make_engine())
    for n, aside in enumerate(["metrics.before-restart.jsonl", "metrics.before-restart.2.jsonl"]):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": {n}}}\n')
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="credo"):
            assert s.resume("auto", tmp_path, rank=0, world=1, allow_config_change=False) == 0
        assert caplog.messages == [f"run.resume=auto: no usable checkpoint in {tmp_path / 'checkpoints'}; starting from "
                                   f"step 0 (the previous metrics.jsonl was moved to {aside})"]
        assert not (tmp_path / "metrics.jsonl").exists() and (tmp_path / aside).read_text() == f'{{"step": {n}}}\n'
    # another rank leaves the file to rank 0
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="credo"):
        assert s.resume("auto", tmp_path, rank=1, world=1, allow_config_change=False) == 0
    assert (tmp_path / "metrics.jsonl").exists()
    assert caplog.messages == [f"run.resume=auto: no usable checkpoint in {tmp_path / 'checkpoints'}; starting from step 0"]


def test_free_name_counts_up_from_2():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.jsonl"
        assert _free_name(p) == p
        p.write_text("")
        assert _free_name(p) == Path(d) / "m.2.jsonl"
        (Path(d) / "m.2.jsonl").write_text("")
        assert _free_name(p) == Path(d) / "m.3.jsonl"


def test_resume_by_a_path_that_is_no_checkpoint_names_the_key(make_engine, tmp_path):
    s = make_state(make_engine())
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=rf"^config key 'run.resume' = '{missing}': not a usable checkpoint \(the folder "
                                          r"does not exist\); expected 'auto' or a checkpoints/step_<N> folder$"):
        s.resume(str(missing), tmp_path, rank=0, world=1, allow_config_change=False)
    empty = tmp_path / "step_00000001"
    empty.mkdir()
    with pytest.raises(ConfigError, match=rf"^config key 'run.resume' = '{empty}': not a usable checkpoint \(.+\); "):
        s.resume(str(empty), tmp_path, rank=0, world=1, allow_config_change=False)


def test_resume_refuses_another_warm_up_and_a_changed_config(make_engine, tmp_path):
    _, folder = saved_state(make_engine(), tmp_path)
    with pytest.raises(ConfigError, match=rf"^checkpoint {folder} was trained from a different warm-up \(sft_key sft-1 "
                                          r"!= sft-2\); resume with the recipe it was made with$"):
        make_state(make_engine(), sft_key="sft-2").resume(str(folder), tmp_path, rank=0, world=1,
                                                           allow_config_change=False)
    changed = json.loads(json.dumps(CONFIG))
    changed["optim"]["lr"], changed["run"]["seed"] = 2.0, 5
    s = make_state(make_engine(), config=changed)
    with pytest.raises(ConfigError) as e:
        s.resume(str(folder), tmp_path, rank=0, world=1, allow_config_change=False)
    assert str(e.value) == (f"resuming {folder} with settings that differ from the checkpoint's:\n"
                            "  optim.lr: 1.0 -> 2.0\n  run.seed: 0 -> 5\n"
                            "resume with the recipe it was made with, or set run.allow_config_change=true")
    assert s.resume(str(folder), tmp_path, rank=0, world=1, allow_config_change=True) == 4
    assert s.config_changed == {"optim.lr": (1.0, 2.0), "run.seed": (0, 5)}


def test_config_changes_compare_key_by_key():
    assert config_changes(None, CONFIG) == {}
    assert config_changes(CONFIG, CONFIG) == {}
    new = json.loads(json.dumps(CONFIG))
    new["algo"]["loss_kwargs"] = {"clip": 0.3}  # a kwargs dict is one value
    new["optim"]["betas"] = [0.9, 0.999]
    assert config_changes(CONFIG, new) == {"algo.loss_kwargs": ({"clip": 0.2}, {"clip": 0.3}),
                                           "optim.betas": ([0.9, 0.99], [0.9, 0.999])}
    # the keys a resumed segment may change freely
    free = {"run": {"steps": 9, "resume": "auto", "output_dir": "/x", "allow_config_change": True, "verbose": True,
                    "progress": False, "plot": False, "wandb": True, "wandb_mode": "online", "wandb_project": "p",
                    "tensorboard": True, "dump_rollouts_every": 1, "eval_every": 5}}
    assert set(RESUME_FREE_KEYS) == {f"run.{k}" for k in free["run"]}
    old = {"run": {"steps": 3, "resume": None, "output_dir": "/y", "allow_config_change": False, "verbose": False,
                   "progress": True, "plot": True, "wandb": False, "wandb_mode": "offline", "wandb_project": "credo",
                   "tensorboard": False, "dump_rollouts_every": 0, "eval_every": 10}}
    assert config_changes(old, free) == {}
    # a key the checkpoint lacks (one added to credo since) is no change at its default, a change otherwise
    default_lr = asdict(recipe_class()())["critic"]["lr"]
    assert config_changes({}, {"critic": {"lr": default_lr}}) == {}
    assert config_changes({}, {"critic": {"lr": default_lr * 2}}) == {"critic.lr": (None, default_lr * 2)}


def test_flatten_keeps_kwargs_dicts_whole():
    assert _flatten({"a": {"b": 1, "c": {"d": 2}, "loss_kwargs": {"e": 3}}, "f": 4}) == \
        {"a.b": 1, "a.c.d": 2, "a.loss_kwargs": {"e": 3}, "f": 4}


def test_resume_from_a_checkpoint_without_counters_or_stage_states(make_engine, tmp_path):
    """A checkpoint written before the counters and the stages' states were kept: they keep their fresh values."""
    _, folder = saved_state(make_engine(), tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["counters"], meta["components"], meta["component_files"]
    (folder / "meta.json").write_text(json.dumps(meta))
    s = make_state(make_engine(1))
    assert s.resume(str(folder), tmp_path, rank=0, world=1, allow_config_change=False) == 4
    assert s.counters == Counters(0, 0, 0) and s.components["source"].pos == 0
