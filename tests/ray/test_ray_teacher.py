"""distill.placement: ray: the teacher on Ray actors (`RayTeacher`, role 'teacher') gives the trainer placement's
log-probs bit for bit (its shards are whole row chunks of the trainer's scorer), and a killed teacher actor is
replaced and its shard scored again, with the same result, counted in cluster/teacher_restarts."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.ray.teacher import RayTeacher, shards
from tests.distill.test_placement import CHUNK, scoring_batch, trainer_scorer
from tests.ray.common import start_local_ray

pytest.importorskip("ray")


@pytest.mark.parametrize("n_rows,rows,workers", [(11, 4, 2), (11, 4, 5), (8, 4, 2), (3, 4, 2), (0, 4, 2), (12, 1, 5),
                                                 (512, 256, 1)])
def test_shards_are_whole_row_chunks_covering_every_row_once(n_rows, rows, workers):
    got = shards(n_rows, rows, workers)
    assert [i for s in got for i in s] == list(range(n_rows))
    assert len(got) <= workers and all(s.start % rows == 0 for s in got)
    chunks = [c.tolist() for c in torch.arange(n_rows).split(rows) if len(c)]  # the trainer scorer's forwards
    assert [c.tolist() for s in got for c in torch.arange(s.start, s.stop).split(rows)] == chunks


@pytest.fixture(scope="module")
def ray_local():
    ray = start_local_ray(num_cpus=4)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.ray.common import tiny_policy

    path, _, _ = tiny_policy(tmp_path_factory.mktemp("teacher"), seed=3)
    return path


def test_two_teacher_actors_give_the_trainers_log_probs_bitwise_and_a_killed_one_is_replaced(ray_local, folder):
    ray = ray_local
    ids, att, mask = scoring_batch()
    want = trainer_scorer(folder, rows=4)(ids, att, mask)
    t = RayTeacher(folder, workers=2, resources={"CPU": 1}, dtype="float32", rows=4, chunk_size=CHUNK,
                   threads=torch.get_num_threads(), max_restarts=1, call_timeout_s=300.0)
    try:
        assert len({i["pid"] for i in t.worker_info().values()}) == 2
        assert torch.equal(t(ids, att, mask), want)
        m = t.metrics()
        assert (m["cluster/teacher_workers"], m["cluster/teacher_restarts"], m["cluster/teacher_redone_shards"]) == \
            (2, 0, 0)
        slot = t.slots[1]
        old = t.group.handles[slot]
        ray.kill(old)  # the actor is gone before the call: its shard fails, is redone on a replacement
        assert torch.equal(t(ids, att, mask), want)
        assert t.group.handles[slot] is not old
        m = t.metrics()
        assert (m["cluster/teacher_restarts"], m["cluster/teacher_redone_shards"]) == (1, 1)
        from credo.distributed.ray.runtime import ClusterWorkerError

        for s in t.slots:  # both lost: two more restarts, past max_restarts = 1 -> the role's error
            ray.kill(t.group.handles[s])
        with pytest.raises(ClusterWorkerError, match=r"role 'teacher': its workers were lost 2 times, more than "
                                                     r"cluster.teacher.max_restarts = 1"):
            t(ids, att, mask)
    finally:
        t.close()


def test_a_teacher_call_past_the_timeout_replaces_the_actor_and_is_counted(ray_local, folder):
    """A call that runs past cluster.call_timeout_s (here every call: 1 us) is a hung actor: killed, replaced and its
    shard redone, each time counted; past max_restarts the role's error says why."""
    from credo.distributed.ray.runtime import ClusterWorkerError

    ids, att, mask = scoring_batch()
    t = RayTeacher(folder, workers=1, dtype="float32", rows=4, chunk_size=CHUNK, max_restarts=1, call_timeout_s=1e-6)
    try:
        with pytest.raises(ClusterWorkerError, match=r"role 'teacher': its workers were lost 2 times, more than "
                                                     r"cluster.teacher.max_restarts = 1; last cause: a call ran past "
                                                     r"cluster.call_timeout_s = 1e-06 s"):
            t(ids, att, mask)
        assert t.metrics()["cluster/teacher_restarts"] == 2
    finally:
        t.close()
