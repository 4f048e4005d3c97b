"""A build of DeepSpeed's CPU op killed mid-compile must not stall every later run.

torch guards the build with a lock file that a killed build leaves behind; torch's wait on it has no timeout, and
CI once stalled for 90 minutes on one (every DeepSpeed start in both test workers waited). credo loads the op
under a kernel flock instead (`engine.load_cpu_comm_op`), so a lock file it finds there is a dead build's.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys

import pytest

from credo.distributed import engine as eng
from tests.reliability.common import REPO, env

START = "from credo.distributed.engine import setup_distributed; print(setup_distributed())"


@pytest.mark.slow  # two fresh processes that start DeepSpeed (the first may build the op: 1-2 minutes, once per user)
def test_a_lock_left_by_a_killed_build_is_removed_and_the_run_starts(tmp_path):
    built = eng.torch_extensions_dir()
    first = subprocess.run([sys.executable, "-c", START], cwd=REPO, env=env(TORCH_EXTENSIONS_DIR=str(built)),
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    ext = tmp_path / "ext"  # a copy of the built op (no rebuild: same sources, mtimes kept), then a dead build's lock
    shutil.copytree(built / eng.SHM_COMM_OP, ext / eng.SHM_COMM_OP)
    (ext / eng.SHM_COMM_OP / "lock").write_text("")
    try:
        p = subprocess.run([sys.executable, "-c", START], cwd=REPO, env=env(TORCH_EXTENSIONS_DIR=str(ext)),
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("setup_distributed waited on the stale build lock")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "(0, 1)"
    assert not (ext / eng.SHM_COMM_OP / "lock").exists()
    assert "a build lock left by a build that was killed" in p.stderr


def test_a_build_still_held_by_a_live_process_is_waited_for_then_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / eng.SHM_COMM_OP).mkdir()
    (ext / eng.SHM_COMM_OP / "lock").write_text("")  # a live build's lock: not to be touched
    with open(ext / f"{eng.SHM_COMM_OP}.credo-lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # this process is "building"
        with pytest.raises(RuntimeError, match=r"still being built by another process after 1 s .*credo-lock"):
            eng.load_cpu_comm_op(ext, wait_s=1.0)
    assert (ext / eng.SHM_COMM_OP / "lock").exists()
