"""MIPU step 2's decision logic (credo.families.mipu.gate.StepGate) with stand-in state, source and T_post: the
threshold schedule reaches the decision, a rejection restores the snapshot and re-syncs, the rollback window,
and the random-rollback control. No model: milliseconds."""

from types import SimpleNamespace

import pytest

from credo.families.mipu.gate import WINDOW, StepGate


class FakeState:
    def __init__(self):
        self.restored, self.taken = [], 0

    def snapshot(self):
        self.taken += 1
        return {"snap": self.taken}

    def restore(self, snap):
        self.restored.append(snap)


class FakeSource:
    def __init__(self):
        self.synced = []

    def sync(self, model, step):
        self.synced.append(step)


def gate(mode="mipu", t_posts=None, **kw):
    g = StepGate(mode=mode, state=FakeState(), source=FakeSource(), engine=SimpleNamespace(module="policy"),
                 val_problems=["p"] * 2, val_group_size=2, **kw)
    if t_posts is not None:
        g.t_post = lambda step: (t_posts[step], 0.5)
    return g


def test_threshold_schedule_reaches_the_decision():
    # c_k: 0.4 at step 1, 0.25 at step 2, 0.1 from step 3 on (linear over anneal_steps=2, steps count from 0)
    t = {1: -0.39, 2: -0.26, 3: -0.11, 4: -0.1}
    g = gate(t_posts=t, c_start=0.4, c_end=0.1, anneal_steps=2)
    rows = [g.decide(s, g.snapshot()) for s in (1, 2, 3, 4)]
    assert [r["mipu/c_k"] for r in rows] == pytest.approx([0.4, 0.25, 0.1, 0.1])
    # accept iff T_post >= -c_k: -0.39 >= -0.4 yes; -0.26 >= -0.25 no; -0.11 >= -0.1 no; -0.1 >= -0.1 yes
    assert [r["mipu/accepted"] for r in rows] == [1.0, 0.0, 0.0, 1.0]
    assert [r["mipu/t_post"] for r in rows] == [-0.39, -0.26, -0.11, -0.1]
    assert [r["mipu/rollback_rate"] for r in rows] == pytest.approx([0, 1 / 2, 2 / 3, 2 / 4])


def test_rejection_restores_that_steps_snapshot_and_resyncs_the_engine():
    g = gate(t_posts={1: 0.0, 2: -1.0, 3: 0.0}, c_start=0.0, c_end=0.0)
    snaps = {}
    for s in (1, 2, 3):
        snaps[s] = g.snapshot()
        g.decide(s, snaps[s])
    assert g.state.restored == [snaps[2]]  # only the rejected step, with its own snapshot
    assert g.source.synced == [2]


def test_rollback_rate_is_a_window_of_the_last_100_steps():
    n = WINDOW + 30
    t = {s: (-1.0 if s <= 30 else 1.0) for s in range(1, n + 1)}  # the first 30 steps are rejected
    g = gate(t_posts=t, c_start=0.0, c_end=0.0)
    rates = [g.decide(s, g.snapshot())["mipu/rollback_rate"] for s in range(1, n + 1)]
    assert rates[29] == 1.0 and rates[WINDOW - 1] == pytest.approx(30 / WINDOW)
    assert rates[-1] == 0.0  # steps 31..130: all accepted, the 30 rejections left the window
    assert g.state_dict()["decisions"] == [0] * WINDOW


def test_random_rollback_rate_and_determinism():
    g = gate(mode="random", rollback_prob=0.3, seed=7)
    acc = [g.decide(s, None)["mipu/accepted"] for s in range(1, 2001)]
    rate = 1 - sum(acc) / len(acc)
    assert abs(rate - 0.3) < 0.04
    again = gate(mode="random", rollback_prob=0.3, seed=7)
    assert [again.decide(s, None)["mipu/accepted"] for s in range(1, 51)] == acc[:50]
    assert "mipu/t_post" not in g.decide(1, None)
    always = gate(mode="random", rollback_prob=1.0)
    assert all(always.decide(s, {"s": s})["mipu/accepted"] == 0.0 for s in range(1, 20))
    assert always.state.restored == [{"s": s} for s in range(1, 20)]


def test_off_gate_copies_nothing_and_logs_nothing():
    g = StepGate(mode=None, state=FakeState(), source=FakeSource())
    assert g.snapshot() is None and g.decide(1, None) == {} and g.state.taken == 0


@pytest.mark.parametrize("kw, message", [
    (dict(val_problems=[], val_group_size=4), "cannot form one group"),
    (dict(val_problems=["p"], val_group_size=1), "cannot form one group"),
    (dict(val_problems=["p"] * 3, val_group_size=2, world=2), "mipu.val_prompts = 3 must be divisible"),
])
def test_a_validation_set_too_small_for_a_group_is_an_error(kw, message):
    with pytest.raises(ValueError, match=message):
        StepGate(mode="mipu", state=FakeState(), source=FakeSource(), **kw)


def test_gather_ragged_concatenates_ranks_of_different_lengths(monkeypatch):
    """Two ranks faked in process: this rank (0) holds 2 values, rank 1 holds 3; every rank gets all 5 in rank
    order, the padding dropped."""
    import torch
    import torch.distributed as dist

    from credo.train.mismatch import gather_ragged

    mine, other = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64)

    def all_gather(out, t):
        if t.dtype == torch.int64:  # the sizes
            out[0].copy_(t)
            out[1].fill_(other.numel())
        else:  # the values, each rank's padded to the widest
            out[0].copy_(t)
            out[1].copy_(torch.nn.functional.pad(other, (0, t.numel() - other.numel())))

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    got = gather_ragged(mine)
    assert got.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0] and got.dtype == torch.float64
