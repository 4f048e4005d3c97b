"""`credo.checkpoint` in detail: what a checkpoint folder holds (manifest, meta, the stages' extra files), how a second
save of a step and a stale temp folder are handled, the exact reports of `verify_checkpoint` and resume, what
`load_checkpoint` asks of the engine, and the RNG state.

The engine is a recording stand-in (it is the argument `save_checkpoint` / `load_checkpoint` drive); the files a real
DeepSpeed engine writes are covered by tests/reliability/test_checkpoint.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random

import numpy as np
import pytest
import torch

import credo.checkpoint as ck


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    from credo.distributed.engine import setup_distributed

    setup_distributed()


class Engine:
    """Writes `<dir>/<tag>/model.bin` holding its weights' bytes and records each save and load call."""

    def __init__(self, loads=True):
        torch.manual_seed(0)
        self.module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        self.saves, self.loads, self.load_ok = [], [], loads

    def save_checkpoint(self, save_dir, **kw):
        self.saves.append((save_dir, kw))
        folder = ck.Path(save_dir) / kw["tag"]
        folder.mkdir(parents=True)
        (folder / "model.bin").write_bytes(self.module[0].weight.detach().numpy().tobytes())

    def load_checkpoint(self, load_dir, **kw):
        self.loads.append((load_dir, kw))
        return (load_dir if self.load_ok else None), {}

    def zero_optimization_stage(self) -> int:  # what credo.distributed.engines.as_train_engine asks a DeepSpeed engine
        return 0


def _save(engine, root, step, **kw):
    return ck.save_checkpoint(engine, root, step, meta=kw.pop("meta", {"data_position": 3}),
                              keep_last=kw.pop("keep_last", 5), **kw)


def test_meta_holds_the_callers_keys_the_step_and_a_checksummed_manifest_of_every_file(tmp_path):
    e = Engine()
    path = _save(e, tmp_path, 7)
    assert path == tmp_path / "step_00000007"
    assert e.saves == [(str(tmp_path / ".tmp-step_00000007"), {"tag": "state", "save_latest": False})]
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta) == {"data_position", "step", "manifest"} and (meta["data_position"], meta["step"]) == (3, 7)
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != "meta.json")
    assert files == ["rng_rank0.pt", "state/model.bin"] and sorted(meta["manifest"]) == files
    for rel, info in meta["manifest"].items():
        data = (path / rel).read_bytes()
        assert info == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ck.verify_checkpoint(path) is None


def test_extra_save_writes_into_the_temp_folder_and_its_dict_joins_meta(tmp_path):
    seen = []

    def extra(folder):
        seen.append(folder)
        (folder / "critic").mkdir()
        (folder / "critic" / "v.bin").write_bytes(b"abc")
        return {"critic_files": 1, "step": 99}

    path = _save(Engine(), tmp_path, 2, meta={"data_position": 3, "critic_files": 0}, extra_save=extra)
    assert seen == [tmp_path / ".tmp-step_00000002"]
    meta = json.loads((path / "meta.json").read_text())
    assert (meta["critic_files"], meta["data_position"], meta["step"]) == (1, 3, 2)  # the step is the save's own
    assert meta["manifest"]["critic/v.bin"] == {"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}
    # an extra_save that returns nothing adds only its files
    path = _save(Engine(), tmp_path, 3, extra_save=lambda folder: (folder / "x.bin").write_bytes(b"x") and None)
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta) == {"data_position", "step", "manifest"} and "x.bin" in meta["manifest"]


def test_a_second_save_of_a_step_replaces_it_and_a_stale_temp_folder_is_cleared(tmp_path):
    e = Engine()
    _save(e, tmp_path, 1, meta={"data_position": 1})
    stale = tmp_path / ".tmp-step_00000001"
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"old")
    with torch.no_grad():
        e.module[0].weight.add_(1.0)
    path = _save(e, tmp_path, 1, meta={"data_position": 2})
    meta = json.loads((path / "meta.json").read_text())
    assert meta["data_position"] == 2 and "junk.bin" not in meta["manifest"] and not (path / "junk.bin").exists()
    assert (path / "state" / "model.bin").read_bytes() == e.module[0].weight.detach().numpy().tobytes()
    assert ck.list_checkpoints(tmp_path) == [path] and not stale.exists()


def test_keep_last_one_keeps_only_the_newest(tmp_path):
    e = Engine()
    for step in (3, 1, 2):
        _save(e, tmp_path, step, keep_last=1)
    # pruning goes by step order, not by the order of writing: step 3 is the newest
    assert ck.list_checkpoints(tmp_path) == [tmp_path / "step_00000003"]


def test_a_non_finite_parameter_is_named_and_nothing_is_written(tmp_path, caplog):
    e = Engine()
    with torch.no_grad():
        e.module[1].bias[0] = float("inf")
    assert ck.params_finite(e.module) == "1.bias"
    with caplog.at_level(logging.ERROR, logger="credo.checkpoint"):
        assert _save(e, tmp_path, 4) is None
    assert caplog.messages == ["not writing checkpoint at step 4: parameter 1.bias is not finite"]
    assert e.saves == [] and list(tmp_path.iterdir()) == []


def test_params_finite_names_the_first_bad_parameter():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert ck.params_finite(m) is None
    with torch.no_grad():
        m[1].weight[0, 0] = float("nan")
        m[0].bias[1] = float("-inf")
    assert ck.params_finite(m) == "0.bias"


def test_list_checkpoints_lists_step_folders_oldest_first(tmp_path):
    assert ck.list_checkpoints(tmp_path / "absent") == []
    for name in ("step_00000010", "step_00000002", "corrupt-step_00000005", ".tmp-step_00000011"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_00000012").write_text("a file, not a checkpoint")
    assert ck.list_checkpoints(tmp_path) == [tmp_path / "step_00000002", tmp_path / "step_00000010"]


def _meta(path, meta):
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps(meta))


def test_verify_checkpoint_says_what_is_wrong(tmp_path):
    p = tmp_path / "step_00000001"
    p.mkdir()
    assert ck.verify_checkpoint(p) == "meta.json is missing (partial write)"
    (p / "meta.json").write_text("{")
    assert ck.verify_checkpoint(p).startswith("meta.json is corrupt (Expecting property name")
    for meta in ({"step": 1}, {"step": 1, "manifest": {}}):
        _meta(p, meta)
        assert ck.verify_checkpoint(p) == "meta.json lists no files (expected a manifest of the checkpoint's files)"
    (p / "a.bin").write_bytes(b"12345")
    good = {"size": 5, "sha256": hashlib.sha256(b"12345").hexdigest()}
    _meta(p, {"manifest": {"a.bin": good}})
    assert ck.verify_checkpoint(p) is None
    _meta(p, {"manifest": {"a.bin": {**good, "size": 6}}})
    assert ck.verify_checkpoint(p) == "a.bin has size 5, expected 6"
    _meta(p, {"manifest": {"a.bin": {**good, "sha256": "0" * 64}}})
    assert ck.verify_checkpoint(p) == "a.bin does not match its checksum"
    _meta(p, {"manifest": {"a.bin": good, "sub/b.bin": good}})
    assert ck.verify_checkpoint(p) == "sub/b.bin is missing"
    (p / "sub" / "b.bin").mkdir(parents=True)  # a folder where a file should be
    assert ck.verify_checkpoint(p) == "sub/b.bin is missing"


def test_resume_reports_each_skipped_folder_and_tidy_sets_it_aside(tmp_path, caplog):
    e = Engine()
    good = _save(e, tmp_path, 1)
    bad = _save(e, tmp_path, 2)
    (bad / "meta.json").unlink()
    (tmp_path / "corrupt-step_00000002").mkdir()  # left by an earlier resume: replaced
    (tmp_path / "corrupt-step_00000002" / "old").write_text("x")
    tmp = tmp_path / ".tmp-step_00000003"
    tmp.mkdir()
    with caplog.at_level(logging.WARNING, logger="credo.checkpoint"):
        assert ck.find_resume_checkpoint(tmp_path) == good
    assert caplog.messages == [f"skipping checkpoint {bad}: meta.json is missing (partial write); trying the "
                               "previous one"]
    assert bad.exists() and tmp.exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="credo.checkpoint"):
        assert ck.find_resume_checkpoint(tmp_path, tidy=True) == good
    aside = tmp_path / "corrupt-step_00000002"
    assert caplog.messages == [
        f"removing {tmp}: a checkpoint write that was interrupted",
        f"skipping checkpoint {bad}: meta.json is missing (partial write); trying the previous one",
        f"renamed the corrupt checkpoint to {aside}"]
    assert not bad.exists() and not tmp.exists() and not (aside / "old").exists() and (aside / "state").is_dir()
    assert ck.find_resume_checkpoint(tmp_path / "absent", tidy=True) is None
    (tmp_path / ".tmp-step_00000004").write_text("not a folder: left where it is, resume goes on")
    assert ck.find_resume_checkpoint(tmp_path, tidy=True) == good


def test_load_checkpoint_asks_for_every_state_and_returns_meta(tmp_path):
    e = Engine()
    path = _save(e, tmp_path, 5)
    assert ck.load_checkpoint(e, path)["step"] == 5
    assert e.loads == [(str(path), {"tag": "state", "load_optimizer_states": True, "load_lr_scheduler_states": True})]


def test_load_checkpoint_refuses_a_bad_folder_unless_told_it_was_verified(tmp_path):
    e = Engine()
    path = _save(e, tmp_path, 5)
    (path / "rng_rank0.pt").write_bytes(b"x")
    with pytest.raises(RuntimeError, match=rf"^checkpoint {path} is not usable: rng_rank0.pt has size 1, expected "):
        ck.load_checkpoint(e, path)
    assert e.loads == []
    (path / "rng_rank0.pt").unlink()
    assert ck.load_checkpoint(e, path, verify=False)["step"] == 5 and len(e.loads) == 1


def test_load_checkpoint_says_when_deepspeed_loads_nothing(tmp_path):
    e = Engine(loads=False)
    path = _save(e, tmp_path, 6)
    with pytest.raises(RuntimeError, match=rf"^DeepSpeed could not load the checkpoint in {path}$"):
        ck.load_checkpoint(e, path)


def test_rng_state_round_trips_python_numpy_and_torch():
    state = ck.rng_state()
    assert set(state) == ({"python", "numpy", "torch", "cuda"} if torch.cuda.is_available()
                          else {"python", "numpy", "torch"})
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ck.set_rng_state({**state, "cuda": ["from a GPU run"]} if not torch.cuda.is_available() else state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws


def test_rng_state_covers_every_cuda_device_when_there_is_one(monkeypatch):
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["dev0", "dev1"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", got.append)
    state = ck.rng_state()
    assert state["cuda"] == ["dev0", "dev1"]
    ck.set_rng_state(state)
    assert got == [["dev0", "dev1"]]
    got.clear()
    ck.set_rng_state({k: v for k, v in state.items() if k != "cuda"})  # saved on CPU, loaded on a GPU
    assert got == []
