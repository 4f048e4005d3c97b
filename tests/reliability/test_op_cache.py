"""DeepSpeed's CPU op is built once per user and Python environment, not once per run folder, and the first build is
announced.

The ~95 s build itself is not run here: deepspeed.init_distributed (which would build and load the op) is
replaced by a recorder, and "not built yet" is an empty temporary TORCH_EXTENSIONS_DIR. Where torch looks for
the build is checked against torch's own function.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from credo.distributed import engine as eng


@pytest.fixture
def fake_init(monkeypatch):
    """setup_distributed as on a fresh CPU process, with DeepSpeed's init recorded instead of run."""
    import deepspeed
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: calls.append(kw))
    monkeypatch.setattr(eng, "load_cpu_comm_op", lambda *a, **kw: None)  # the build (tests/reliability/test_op_lock.py)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for k in (*eng.DIST_ENV_VARS, "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "CREDO_CACHE"):
        monkeypatch.delenv(k, raising=False)
    return calls


def test_the_op_cache_is_per_user_not_per_folder(fake_init, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    seen = []
    for folder in ("project_a", "project_b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        eng.setup_distributed()
        seen.append(os.environ["TORCH_EXTENSIONS_DIR"])
    assert seen == [str(home / ".cache" / "credo" / "torch_extensions" / eng.python_env_tag())] * 2
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert eng.torch_extensions_dir() == tmp_path / "xdg" / "credo" / "torch_extensions" / eng.python_env_tag()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert eng.torch_extensions_dir() == tmp_path / "mine"  # an explicit setting wins


def test_the_first_build_is_announced_once(fake_init, tmp_path, monkeypatch, capsys):
    from torch.utils.cpp_extension import _get_build_directory

    ext = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    eng.setup_distributed()
    err = capsys.readouterr().err
    assert err.count("compiling its CPU op 'deepspeed_shm_comm'") == 1 and str(ext) in err
    # torch builds (and looks for) the op's library in this folder; once it is there nothing is printed
    build = Path(_get_build_directory(eng.SHM_COMM_OP, verbose=False))
    assert build == ext / eng.SHM_COMM_OP
    build.mkdir(parents=True, exist_ok=True)
    (build / f"{eng.SHM_COMM_OP}.so").write_bytes(b"")
    eng.setup_distributed()
    assert capsys.readouterr().err == ""
    assert len(fake_init) == 2


def test_only_the_first_local_rank_announces_and_gpu_runs_never(fake_init, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "empty"))
    for k, v in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555").items():
        monkeypatch.setenv(k, v)
    eng.setup_distributed()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # nccl: DeepSpeed builds no CPU op
    monkeypatch.delenv("DS_ACCELERATOR")
    eng.setup_distributed()
    assert capsys.readouterr().err == ""


def test_two_python_environments_do_not_share_a_build(tmp_path, monkeypatch):
    """Issue 57's round-4 trial: a fresh clone's .venv and another checkout's venv shared one build folder, and
    ninja rebuilt the op (1-5 minutes, unannounced since a .so was there) at every switch between them."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("sys.prefix", str(tmp_path / "clone" / ".venv"))
    clone = eng.torch_extensions_dir()
    assert clone == eng.torch_extensions_dir()  # stable within one environment
    monkeypatch.setattr("sys.prefix", str(tmp_path / "main" / ".venv"))
    main = eng.torch_extensions_dir()
    assert clone != main and clone.parent == main.parent == tmp_path / "xdg" / "credo" / "torch_extensions"
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # torch upgraded in that venv: built anew, and announced
    assert eng.torch_extensions_dir() not in (clone, main)
    assert eng.op_build_notice(eng.torch_extensions_dir()) is not None
