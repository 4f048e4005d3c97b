"""distill.placement: worker and ray at `credo check` (what is accepted, what is refused naming both keys, the teacher
role counted in the Ray capacity check), and the worker's scorer alone on a tiny model: its own process gives the
trainer placement's log-probs bit for bit, and is gone when closed or when it dies (an error naming it). The Ray
actors' scorer is tests/ray/test_ray_teacher.py; whole runs compared line by line are
tests/distill/test_placement_runs.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from credo.config import load_recipe
from credo.errors import ConfigError
from credo.train.build import check_run

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "distill.yaml"
CHUNK = 16
"""algo.logprob_chunk_size of the scorers here: fewer tokens than a batch has, so the log-softmax runs in chunks."""


def check(*overrides):
    return list(check_run(load_recipe(str(RECIPE), list(overrides))).notes)


def test_worker_is_accepted_and_ray_needs_the_runs_ray_cluster():
    from credo.distributed.ray.config import run_roles

    check("distill.placement=worker")
    check("distill.placement=worker", "cluster.engine=ray", "cluster.num_cpus=3")  # the worker beside a Ray run
    with pytest.raises(ConfigError, match="config keys 'distill.placement' and 'cluster.engine' cannot be used "
                                          "together: the teacher's Ray actors run on the run's Ray cluster"):
        check("distill.placement=ray")
    with pytest.raises(ConfigError, match="config keys 'distill.placement' and 'cluster.teacher.workers' cannot"):
        check("distill.placement=ray", "cluster.engine=ray", "cluster.num_cpus=4", "cluster.teacher.workers=0")
    notes = check("distill.placement=ray", "cluster.engine=ray", "cluster.num_cpus=4")
    assert all("teacher" not in n for n in notes)
    r = load_recipe(str(RECIPE), ["distill.placement=ray", "cluster.engine=ray", "cluster.teacher.workers=2"])
    assert run_roles(r) == ("rollout", "reward", "teacher")
    assert run_roles(load_recipe(str(RECIPE), ["cluster.engine=ray"])) == ("rollout", "reward")  # trainer: no role
    assert run_roles(load_recipe(str(RECIPE), ["cluster.engine=ray", "distill.enabled=false",
                                               "distill.placement=ray"])) == ("rollout", "reward")


@pytest.mark.parametrize("overrides, message", [
    # 3 CPUs hold the rollout actor, one reward task and the teacher actor; 2 do not: the sum names the teacher
    (["cluster.num_cpus=2"], r"cluster.rollout.workers' = 1: the run's roles ask for \{CPU: 3\} in all \(rollout 1 x "
                             r"\{CPU: 1\}; reward 1 x \{CPU: 1\} \(one task at least\); teacher 1 x \{CPU: 1\}\) but "
                             r"the Ray cluster offers \{CPU: 2\}"),
    (["cluster.num_cpus=4", "cluster.teacher.workers=3"], r"cluster.rollout.workers' = 1: .*teacher 3 x \{CPU: 1\}"),
    # a teacher no node of this machine can host, even alone: its own key
    (["cluster.num_cpus=4", "cluster.teacher.resources={GPU: 64}"],
     r"config key 'cluster.teacher.workers' = 1: .*teacher 1 x \{GPU: 64\}"),
    (["cluster.num_cpus=4", "cluster.teacher.resources={teacher_node: 1}"],
     r"config key 'cluster.teacher.workers' = 1"),
])
def test_the_teacher_actors_are_counted_in_the_ray_capacity_check(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check("distill.placement=ray", "cluster.engine=ray", *overrides)
    check("cluster.engine=ray", *overrides)  # the same cluster without the teacher role is not refused for it


def test_the_teacher_role_checks_its_values_at_load():
    with pytest.raises(ConfigError, match=r"config key 'cluster.teacher.workers' = -1 is out of range"):
        load_recipe(str(RECIPE), ["cluster.teacher.workers=-1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'cluster.teacher.thread'; did you mean"):
        load_recipe(str(RECIPE), ["cluster.teacher.thread=1"])
    r = load_recipe(str(RECIPE), ["cluster.teacher.threads=2"])
    assert (r.cluster.teacher.workers, r.cluster.teacher.threads, r.cluster.teacher.max_restarts) == (1, 2, 3)


# ---------------------------------------------------------------------------------------------- the scorer alone
@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    from tests.ray.common import tiny_policy

    path, _, _ = tiny_policy(tmp_path_factory.mktemp("teacher"), seed=3)
    return path


def scoring_batch(rows: int = 11, length: int = 13, seed: int = 0):
    """Right-padded rows of random token ids with random lengths; the mask: each row's tokens after a random prompt."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 120, (rows, length), generator=g)
    lengths = torch.randint(4, length + 1, (rows,), generator=g)
    pos = torch.arange(length)
    att = (pos[None] < lengths[:, None]).long()
    ids = ids * att
    prompt = torch.randint(1, 4, (rows,), generator=g)
    mask = (pos[None, 1:] >= prompt[:, None]) & att[:, 1:].bool()
    mask[3] = False  # a row with nothing to score
    return ids, att, mask


def trainer_scorer(folder: str, rows: int):
    from credo.families.distill.teacher import TeacherScorer
    from credo.models import load_causal_lm

    model = load_causal_lm(folder, "float32").eval().requires_grad_(False)
    return TeacherScorer(model, rows=rows, chunk_size=CHUNK, device=torch.device("cpu"))


def test_the_worker_process_gives_the_trainers_log_probs_bitwise_and_is_gone_when_closed(teacher_folder):
    from credo.families.distill.worker import TeacherProcess

    ids, att, mask = scoring_batch()
    want = trainer_scorer(teacher_folder, rows=4)(ids, att, mask)
    assert want[mask].lt(0).all() and want[~mask].eq(0).all()
    t = TeacherProcess(teacher_folder, dtype="float32", rows=4, chunk_size=CHUNK, device="cpu",
                       threads=torch.get_num_threads())
    try:
        assert t.info["pid"] != os.getpid() and t.info["pid"] == t.proc.pid
        got = t(ids, att, mask)
        assert got.dtype == torch.float32 and torch.equal(got, want)
        assert torch.equal(t(ids[5:], att[5:], mask[5:]), trainer_scorer(teacher_folder, rows=4)(ids[5:], att[5:],
                                                                                                 mask[5:]))
    finally:
        t.close()
    assert not t.proc.is_alive() and t.proc.exitcode == 0  # it stopped when asked
    t.close()  # twice is fine
    from credo.families.distill.worker import TeacherWorkerError

    with pytest.raises(TeacherWorkerError, match="closed"):
        t(ids, att, mask)


def test_a_dead_worker_process_is_an_error_naming_it(teacher_folder):
    from credo.families.distill.worker import TeacherProcess, TeacherWorkerError

    ids, att, mask = scoring_batch()
    t = TeacherProcess(teacher_folder, dtype="float32", rows=4, chunk_size=CHUNK, device="cpu", threads=1)
    try:
        t.proc.kill()
        t.proc.join(timeout=10)
        with pytest.raises(TeacherWorkerError, match=rf"teacher's process \(pid {t.proc.pid}\) died with exit code -9"):
            t(ids, att, mask)
    finally:
        t.close()
    with pytest.raises(TeacherWorkerError, match="failed loading the teacher"):
        TeacherProcess(str(Path(teacher_folder).parent / "no-such-teacher"), dtype="float32", rows=4, chunk_size=CHUNK,
                       device="cpu", threads=1)


KILLED_TRAINER = """
import os, signal, sys, torch
from credo.families.distill.worker import TeacherProcess
t = TeacherProcess(sys.argv[1], dtype="float32", rows=4, chunk_size=16, device="cpu", threads=1)
print(t.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the trainer crashes: no close(), no atexit
"""


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited, not yet reaped by whoever adopted it


def test_the_worker_process_exits_when_its_trainer_is_killed(teacher_folder):
    import subprocess
    import sys
    import time

    p = subprocess.run([sys.executable, "-c", KILLED_TRAINER, teacher_folder], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == -9, p.stderr[-2000:]
    pid = int(p.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(pid)
