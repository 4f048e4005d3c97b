"""The shared-memory double buffer: a reader gets the newest whole version, the writer never overwrites the newest
slot nor one being read, and a reader never picks a slot being written."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.weight_buffer import WRITING, WeightBuffers


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def params(m):
    return [p.detach().clone() for p in m.parameters()]


@pytest.fixture
def ctx():
    return torch.multiprocessing.get_context("spawn")


def test_a_reader_takes_the_newest_version_whole(ctx):
    a, b, reader = model(0), model(1), model(2)
    buf = WeightBuffers(a, ctx)
    assert buf.take(reader, -1) == -1  # nothing published: the reader keeps its own weights
    buf.publish(a, 1, timeout_s=1)
    buf.publish(b, 2, timeout_s=1)
    assert buf.take(reader, -1) == 2
    assert all(torch.equal(x, y) for x, y in zip(params(reader), params(b)))
    assert buf.take(reader, 2) == 2  # not newer: no copy
    buf.publish(a, 3, timeout_s=1)  # written into the older slot (version 1's), version 2 stays readable meanwhile
    assert sorted(buf.versions[:]) == [2, 3]
    assert buf.take(reader, 2) == 3 and all(torch.equal(x, y) for x, y in zip(params(reader), params(a)))


def test_the_writer_waits_for_a_reader_of_the_older_slot_and_never_takes_the_newest(ctx):
    a = model(0)
    buf = WeightBuffers(a, ctx)
    buf.publish(a, 1, timeout_s=1)
    buf.publish(a, 2, timeout_s=1)
    older = 0 if buf.versions[0] == 1 else 1
    buf.readers[older] = 1  # a worker still copying version 1 out
    with pytest.raises(TimeoutError, match=f"weight slot {older}"):
        buf.publish(a, 3, timeout_s=0.05)
    assert max(buf.versions[:]) == 2  # the newest slot was not touched
    buf.readers[older] = 0
    buf.publish(a, 3, timeout_s=1)
    assert buf.versions[older] == 3


def test_a_reader_never_picks_a_slot_being_written(ctx):
    a, b, reader = model(0), model(1), model(2)
    buf = WeightBuffers(a, ctx)
    buf.publish(a, 1, timeout_s=1)
    buf.publish(b, 2, timeout_s=1)
    newest = 0 if buf.versions[0] == 2 else 1
    buf.versions[1 - newest] = WRITING
    assert buf.take(reader, 0) == 2
    buf.versions[newest], buf.versions[1 - newest] = WRITING, 1  # (the writer never does this; a reader must cope)
    assert buf.take(reader, 0) == 1 and all(torch.equal(x, y) for x, y in zip(params(reader), params(a)))
