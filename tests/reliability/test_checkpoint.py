"""Checkpoint files: atomic write, manifest verification, corrupt/partial folders skipped, no NaN written.

A real DeepSpeed engine around a small linear layer (ZeRO-1, fp32, CPU), so the files are the ones the
trainer writes. Each test saves into its own folder.
"""

from __future__ import annotations

import json
import math
import os
import logging
import random

import numpy as np
import pytest
import torch

from credo.checkpoint import (find_resume_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint,
                              verify_checkpoint)

MODEL_STATES = "state/mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def make_engine():
    from credo.distributed.engine import build_engine, setup_distributed

    setup_distributed()

    def make(seed: int = 0):
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 3)
        return build_engine(model, lr=1e-2, betas=[0.9, 0.999], weight_decay=0.0, grad_clip=1.0, zero_stage=1,
                            warmup_steps=10, micro_batch=2, grad_accum=1, bf16=False)

    return make


def train_step(engine, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, generator=g)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()


def save(engine, root, step, keep_last=5):
    return save_checkpoint(engine, root, step, meta={"data_position": step, "sft_key": "k"}, keep_last=keep_last)


def params(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.named_parameters()}


def test_save_is_complete_and_verifies(make_engine, tmp_path):
    engine = make_engine()
    train_step(engine, 0)
    path = save(engine, tmp_path, 1)
    assert path == tmp_path / "step_00000001" and path.is_dir()
    assert not list(tmp_path.glob(".tmp-*")), "the temp folder must be renamed away"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 1 and meta["sft_key"] == "k" and meta["data_position"] == 1
    # DeepSpeed's model and optimizer states and the RNG file are all under the manifest
    assert {MODEL_STATES, "rng_rank0.pt"} <= set(meta["manifest"])
    assert any("optim_states" in f for f in meta["manifest"])
    assert verify_checkpoint(path) is None


def _truncate(path):
    f = path / MODEL_STATES
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip_byte(path):
    f = path / MODEL_STATES
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def _delete_rng(path):
    (path / "rng_rank0.pt").unlink()


def _delete_meta(path):
    (path / "meta.json").unlink()


def _garble_meta(path):
    (path / "meta.json").write_text('{"step": 2, "manif')


CORRUPTIONS = {
    "truncated": (_truncate, f"{MODEL_STATES} has size"),
    "flipped byte": (_flip_byte, f"{MODEL_STATES} does not match its checksum"),
    "missing file": (_delete_rng, "rng_rank0.pt is missing"),
    "missing meta": (_delete_meta, "meta.json is missing"),
    "torn meta": (_garble_meta, "meta.json is corrupt"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_newest_is_reported_and_previous_used(make_engine, tmp_path, caplog, kind):
    corrupt, expected = CORRUPTIONS[kind]
    engine = make_engine()
    for step in (1, 2):
        train_step(engine, step)
        save(engine, tmp_path, step)
    newest = tmp_path / "step_00000002"
    corrupt(newest)
    assert expected in verify_checkpoint(newest)
    with caplog.at_level(logging.WARNING, logger="credo.checkpoint"):
        assert find_resume_checkpoint(tmp_path) == tmp_path / "step_00000001"
    assert any("step_00000002" in m and expected in m for m in caplog.messages), caplog.messages
    assert newest.exists(), "without tidy the folder is only skipped"
    with pytest.raises(RuntimeError, match="step_00000002 is not usable"):
        load_checkpoint(engine, newest)
    # tidy (rank 0 at resume) sets it aside: later resumes and keep_last pruning no longer see it
    assert find_resume_checkpoint(tmp_path, tidy=True) == tmp_path / "step_00000001"
    assert not newest.exists() and (tmp_path / "corrupt-step_00000002").is_dir()
    assert list_checkpoints(tmp_path) == [tmp_path / "step_00000001"]


def test_interrupted_write_is_ignored_and_tidied(make_engine, tmp_path, caplog):
    """A kill mid-write leaves only `.tmp-step_N`: never listed, removed at resume."""
    engine = make_engine()
    train_step(engine, 0)
    save(engine, tmp_path, 1)
    partial = tmp_path / ".tmp-step_00000002" / "state"
    partial.mkdir(parents=True)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 10)
    assert list_checkpoints(tmp_path) == [tmp_path / "step_00000001"]
    assert find_resume_checkpoint(tmp_path) == tmp_path / "step_00000001"
    with caplog.at_level(logging.WARNING, logger="credo.checkpoint"):
        find_resume_checkpoint(tmp_path, tidy=True)
    assert not partial.parent.exists()
    assert any(".tmp-step_00000002" in m and "interrupted" in m for m in caplog.messages)


def test_no_good_checkpoint_gives_none(make_engine, tmp_path):
    engine = make_engine()
    save(engine, tmp_path, 1)
    _truncate(tmp_path / "step_00000001")
    assert find_resume_checkpoint(tmp_path) is None
    assert find_resume_checkpoint(tmp_path / "absent") is None


def test_keep_last_prunes_oldest(make_engine, tmp_path):
    engine = make_engine()
    for step in range(1, 5):
        save(engine, tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]


def test_non_finite_model_is_never_written(make_engine, tmp_path, caplog):
    engine = make_engine()
    save(engine, tmp_path, 1)
    with torch.no_grad():
        engine.module.weight[1, 2] = float("nan")
    with caplog.at_level(logging.ERROR, logger="credo.checkpoint"):
        assert save(engine, tmp_path, 2) is None
    assert list_checkpoints(tmp_path) == [tmp_path / "step_00000001"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert any("weight is not finite" in m for m in caplog.messages)


def test_a_non_finite_model_on_another_rank_is_never_written(make_engine, tmp_path, caplog, monkeypatch):
    import credo.checkpoint as ck

    engine = make_engine()  # finite here; the all-reduce says one other rank holds a non-finite parameter
    monkeypatch.setattr(ck, "all_reduce_sum", lambda x: x + 1)
    with caplog.at_level(logging.ERROR, logger="credo.checkpoint"):
        assert save(engine, tmp_path, 3) is None
    assert list_checkpoints(tmp_path) == [] and not list(tmp_path.glob(".tmp-*"))
    assert "not writing checkpoint at step 3: parameter (on another rank) is not finite" in caplog.messages


def test_load_restores_params_optimizer_scheduler_and_rng(make_engine, tmp_path):
    """Train 2 steps, save, train 2 more; a fresh engine loaded from the save, trained the same 2 steps,
    matches bit for bit (Adam moments and the warm-up schedule included), and draws the same random
    numbers from python, numpy and torch."""
    a = make_engine(seed=0)
    for s in (1, 2):
        train_step(a, s)
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    path = save(a, tmp_path, 2)
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    lr_at_save = a.get_lr()[0]
    for s in (3, 4):
        train_step(a, s)

    b = make_engine(seed=123)  # different initial weights: everything must come from the checkpoint
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    meta = load_checkpoint(b, path)
    assert meta["step"] == 2
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws
    assert b.get_lr()[0] == lr_at_save < 1e-2  # still warming up: the scheduler position came back
    for s in (3, 4):
        train_step(b, s)
    pa, pb = params(a), params(b)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


class _FakeEngine:
    """The parts of a DeepSpeed engine `optimizer_step` and `step_without_update` touch; records each step."""

    def __init__(self, boundary: bool, grad: float, **opt_attrs):
        from types import SimpleNamespace

        self.module = torch.nn.Linear(2, 1)
        for p in self.module.parameters():
            p.grad = torch.full_like(p, grad)
        self.optimizer = SimpleNamespace(**opt_attrs)
        self._config = SimpleNamespace(gradient_clipping=1.0)
        self.boundary, self.steps = boundary, []

    def is_gradient_accumulation_boundary(self):
        return self.boundary

    def step(self):
        self.steps.append((getattr(self.optimizer, "overflow", None), self._config.gradient_clipping,
                           [p.grad for p in self.module.parameters()]))


@pytest.mark.parametrize("boundary, zero_stage, grad, expect", [
    (True, 0, 1.0, "checked"),  # ZeRO-0 at a boundary: credo checks the norm (3 grads of 1 -> sqrt(3))...
    (True, 0, float("nan"), "skipped"),  # ... and skips a non-finite step itself
    (False, 0, float("nan"), "plain"),  # between boundaries DeepSpeed applies nothing: no check
    (True, 2, float("nan"), "plain"),  # ZeRO-1/2/3: DeepSpeed's own overflow check
])
def test_optimizer_step_checks_the_norm_only_at_a_zero0_boundary(boundary, zero_stage, grad, expect):
    from credo.distributed.engine import optimizer_step

    e = _FakeEngine(boundary, grad)
    finite, norm = optimizer_step(e, zero_stage)
    assert len(e.steps) == 1
    if expect == "plain":
        assert (finite, norm) == (True, None) and e.steps[0][0] is None  # a plain engine.step()
    elif expect == "checked":
        assert finite and norm == pytest.approx(3 ** 0.5)
    else:
        assert not finite and math.isnan(norm) and e.steps[0][0] is True  # stepped as an overflow


def test_step_without_update_restores_the_optimizers_overflow_flag_and_clipping():
    from credo.distributed.engine import step_without_update

    e = _FakeEngine(True, 1.0, overflow=False)
    step_without_update(e)
    assert [(o, c, all(g is None for g in gs)) for o, c, gs in e.steps] == [(True, 0.0, True)]
    assert e.optimizer.overflow is False and e._config.gradient_clipping == 1.0
    bare = _FakeEngine(True, 1.0)
    step_without_update(bare)
    assert not hasattr(bare.optimizer, "overflow") and bare.steps[0][0] is True


@pytest.mark.parametrize("cuda, verbose", [(False, False), (False, True), (True, False)])
def test_setup_distributed_picks_the_backend_and_swallows_deepspeeds_print_unless_verbose(monkeypatch, capsys,
                                                                                         cuda, verbose):
    """A first initialisation in a process, faked: nccl on CUDA, gloo otherwise; DeepSpeed's stdout print shown
    only with verbose."""
    import deepspeed
    import torch.distributed as dist

    from credo.distributed.engine import setup_distributed

    calls = []

    def fake_init(dist_backend, verbose):
        print("DeepSpeed op built successfully")
        calls.append(dist_backend)

    monkeypatch.setattr(deepspeed, "init_distributed", fake_init)
    monkeypatch.setattr("credo.distributed.engine.load_cpu_comm_op", lambda *a, **kw: None)  # no op build here
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999",
                     DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"),
                     TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp/te")).items():
        monkeypatch.setenv(k, os.environ.get(k, v))  # whatever setup_distributed sets is undone after the test
    capsys.readouterr()
    assert setup_distributed(verbose=verbose) == (0, 1)
    assert calls == ["nccl" if cuda else "gloo"]
    assert ("DeepSpeed op built successfully" in capsys.readouterr().out) is verbose


def test_all_gather_cat_concatenates_the_ranks_in_rank_order(monkeypatch):
    """Two ranks simulated in one process: all_gather hands each rank's tensor to every rank."""
    import credo.distributed.engine as eng

    x = torch.arange(6.0).reshape(3, 2)[:, :1]  # a non-contiguous column: gathered as a contiguous copy
    other = torch.full((3, 1), -1.0)

    def all_gather(parts, y):
        assert y.is_contiguous() and torch.equal(y, x)
        parts[0].copy_(y)
        parts[1].copy_(other)

    assert eng.all_gather_cat(x) is x  # one process: nothing to gather
    monkeypatch.setattr(eng.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(eng.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(eng.dist, "all_gather", all_gather)
    got = eng.all_gather_cat(x)
    assert torch.equal(got, torch.cat([x, other])) and got.device == x.device
