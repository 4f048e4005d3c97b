"""`credo.distributed.engine` in this process: the DeepSpeed config `build_engine` hands over, the LR schedule, the
world-of-one set-up, the collective helpers with two ranks simulated, the update-step helpers and the in-memory
engine copy that rollbacks use.

Real DeepSpeed engines around a small linear layer (CPU, gloo), built once per module; the collectives of a world of
two are faked on `torch.distributed` (one process cannot hold two ranks).
"""

from __future__ import annotations

import hashlib
import math
import os
from types import SimpleNamespace

import pytest
import torch

import credo.distributed.engine as eng


def _make(*, zero_stage=1, bf16=False, seed=0, **kw):
    eng.setup_distributed()
    torch.manual_seed(seed)
    args = dict(lr=0.1, betas=[0.8, 0.9], weight_decay=0.05, grad_clip=0.5, zero_stage=zero_stage, warmup_steps=4,
                micro_batch=2, grad_accum=3, bf16=bf16)
    return eng.build_engine(torch.nn.Linear(4, 3), **{**args, **kw})


@pytest.fixture(scope="module")
def zero1():
    """ZeRO-1, fp32, linear warm-up over 4 steps then a constant LR (the default schedule)."""
    return _make(zero_stage=1)


def _train(engine, seed, n=1):
    for i in range(n):
        g = torch.Generator().manual_seed(seed + i)
        x = torch.randn(2, 4, generator=g)
        loss = engine(x.to(engine.module.weight.dtype)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()


# ------------------------------------------------------------------------------------------- build_engine
def test_build_engine_hands_deepspeed_the_batch_clipping_zero_and_precision_settings(zero1):
    e = zero1
    assert (e.train_micro_batch_size_per_gpu(), e.gradient_accumulation_steps(), e.train_batch_size()) == (2, 3, 6)
    assert e.gradient_clipping() == 0.5 and e.zero_optimization_stage() == 1 and not e.bfloat16_enabled()
    assert e.steps_per_print() == 10**9 and e.wall_clock_breakdown() is False
    assert e.zero_allow_untested_optimizer()  # a torch AdamW under ZeRO
    group = e.optimizer.param_groups[0]
    assert (group["betas"], group["weight_decay"]) == ((0.8, 0.9), 0.05)
    assert isinstance(e.optimizer.optimizer, torch.optim.AdamW)  # ZeRO-1 wraps the torch AdamW
    assert e.module.weight.dtype == torch.float32


def test_build_engine_in_bf16_on_zero0():
    e = _make(zero_stage=0, bf16=True)
    assert e.bfloat16_enabled() and e.zero_optimization_stage() == 0 and e.module.weight.dtype == torch.bfloat16


def test_constant_schedule_warms_up_linearly_then_holds_the_lr(zero1):
    # the scheduler's factor after s steps: min(1, (s + 1) / 4); the engine starts at s = 0
    assert zero1.get_lr()[0] == pytest.approx(0.1 / 4)
    factor = zero1.lr_scheduler.lr_lambdas[0]
    assert [factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert factor(100) == 1.0


def test_constant_schedule_without_warm_up_is_flat():
    e = _make(zero_stage=0, warmup_steps=0)
    assert e.get_lr()[0] == 0.1 and [e.lr_scheduler.lr_lambdas[0](s) for s in (0, 1, 50)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_decaying_schedule_is_lr_factor_with_the_recipes_settings(schedule):
    e = _make(zero_stage=0, lr_schedule=schedule, total_steps=10, min_lr_ratio=0.1)
    factor = e.lr_scheduler.lr_lambdas[0]
    # warm-up 4 steps: s = 0 -> 1/4 of the full LR; decay over steps 4..10 to 0.1 of it, then held
    expect = {0: 0.25, 3: 1.0, 10: 0.1, 20: 0.1}
    frac = 3 / 6  # s = 7: half-way through the decay
    expect[7] = 0.1 + 0.9 * (1 - frac if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * frac)))
    assert {s: factor(s) for s in expect} == pytest.approx(expect)
    assert e.get_lr()[0] == pytest.approx(0.1 * 0.25)


def test_a_decaying_schedule_decays_to_zero_by_default():
    factor = _make(zero_stage=0, lr_schedule="linear", total_steps=10).lr_scheduler.lr_lambdas[0]
    assert [factor(s) for s in (3, 7, 10, 11)] == pytest.approx([1.0, 0.5, 0.0, 0.0])


# ---------------------------------------------------------------------------------------------- lr_factor
def test_lr_factor_by_hand():
    f = eng.lr_factor
    assert f(0, warmup_steps=4) == 0.25 and f(2, warmup_steps=4) == 0.75 and f(9, warmup_steps=4) == 1.0
    assert f(0, warmup_steps=0) == 1.0 and f(0, warmup_steps=-1) == 1.0
    # a schedule that ends within the warm-up (or is not set) only warms up
    assert f(1, warmup_steps=4, schedule="linear", total_steps=4) == 0.5
    assert f(1, warmup_steps=4, schedule="linear", total_steps=3) == 0.5
    assert f(8, warmup_steps=4, schedule="cosine") == 1.0
    # linear from 1 at s = 2 to min_lr_ratio at s = 6 (warm-up 2): s = 3 -> 3/4 of the way from 0.2 to 1
    assert f(3, warmup_steps=2, schedule="linear", total_steps=6, min_lr_ratio=0.2) == pytest.approx(0.2 + 0.8 * 0.75)
    assert f(2, warmup_steps=2, schedule="linear", total_steps=6) == 1.0
    assert f(6, warmup_steps=2, schedule="linear", total_steps=6) == 0.0
    assert f(60, warmup_steps=2, schedule="linear", total_steps=6, min_lr_ratio=0.3) == pytest.approx(0.3)
    # during the warm-up of a decaying schedule: the warm-up factor times a not-yet-decayed 1
    assert f(0, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.5) == 0.5
    # cosine: a quarter of the way, 0.5 * (1 + cos(pi / 4))
    assert f(3, warmup_steps=2, schedule="cosine", total_steps=6) == pytest.approx(0.5 * (1 + 2 ** -0.5))
    assert f(6, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.1) == pytest.approx(0.1)


# ------------------------------------------------------------------------------------- setup and device
def test_dist_env_vars_name_what_a_launcher_sets():
    assert set(eng.DIST_ENV_VARS) == {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                      "LOCAL_WORLD_SIZE", "GROUP_RANK"}


def test_free_port_is_a_port_that_can_be_bound():
    import socket

    port = eng._free_port()
    assert isinstance(port, int) and 1024 <= port < 65536  # one the kernel picked, not a privileged one
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("cuda", [False, True])
def test_setup_distributed_makes_a_world_of_one_when_not_launched(monkeypatch, cuda):
    import deepspeed
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: calls.append(kw))
    monkeypatch.setattr(eng, "load_cpu_comm_op", lambda *a, **kw: None)  # no op build here
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for k in (*eng.DIST_ENV_VARS, "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.delenv(k, raising=False)  # restored after the test
    assert eng.setup_distributed() == (0, 1)
    assert calls == [{"dist_backend": "nccl" if cuda else "gloo", "verbose": False}]
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}
    assert env == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    assert 0 < int(os.environ["MASTER_PORT"]) < 65536
    assert os.environ.get("DS_ACCELERATOR") == (None if cuda else "cpu")
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(eng.torch_extensions_dir())


def test_setup_distributed_keeps_a_launchers_world_and_an_initialised_group(monkeypatch):
    import deepspeed
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: calls.append(kw))
    monkeypatch.setattr(eng, "load_cpu_comm_op", lambda *a, **kw: None)  # no op build here
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = dict(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", MASTER_ADDR="10.0.0.1", MASTER_PORT="1234",
               DS_ACCELERATOR="mine", TORCH_EXTENSIONS_DIR="/elsewhere")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert eng.setup_distributed() == (3, 4)
    assert calls == [] and {k: os.environ[k] for k in env} == env


def test_device_is_the_local_ranks_gpu_or_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert eng.device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert eng.device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert eng.device() == torch.device("cuda", 0)


# ------------------------------------------------------------------------ collectives, two ranks simulated
@pytest.fixture
def two_ranks(monkeypatch):
    """A world of two in this process; records every collective call."""
    calls = []
    monkeypatch.setattr(eng.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(eng.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(eng.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return calls


def test_all_reduce_sum_and_max_reduce_a_copy_with_their_op(two_ranks, monkeypatch):
    other = torch.tensor([5.0, -1.0])

    def all_reduce(y, op):
        two_ranks.append(op)
        if op == eng.dist.ReduceOp.SUM:
            y.add_(other)
        else:
            torch.maximum(y, other, out=y)

    monkeypatch.setattr(eng.dist, "all_reduce", all_reduce)
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(eng.all_reduce_sum(x), torch.tensor([6.0, 1.0]))
    assert torch.equal(eng.all_reduce_max(x), torch.tensor([5.0, 2.0]))
    assert two_ranks == [eng.dist.ReduceOp.SUM, eng.dist.ReduceOp.MAX]
    assert torch.equal(x, torch.tensor([1.0, 2.0])), "the input is not reduced in place"


def test_world_of_one_collectives_return_copies_and_do_not_call_torch_distributed(monkeypatch):
    monkeypatch.setattr(eng.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(eng.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(eng.dist, "get_rank", lambda: 0)
    for name in ("all_reduce", "barrier", "all_gather", "all_gather_object"):
        monkeypatch.setattr(eng.dist, name, lambda *a, **k: pytest.fail("no collective in a world of one"))
    x = torch.tensor([1.0, 2.0])
    for f in (eng.all_reduce_sum, eng.all_reduce_max):
        y = f(x)
        assert torch.equal(y, x) and y is not x
        y += 1
        assert torch.equal(x, torch.tensor([1.0, 2.0]))
    eng.barrier()
    assert eng.rank_and_world() == (0, 1)
    assert len(eng.param_digests(torch.nn.Linear(2, 2))) == 1
    monkeypatch.setattr(eng.dist, "is_initialized", lambda: False)
    assert eng.rank_and_world() == (0, 1)
    assert eng.all_reduce_sum(x) is not x


def test_barrier_and_rank_and_world_in_a_world_of_two(two_ranks, monkeypatch):
    monkeypatch.setattr(eng.dist, "barrier", lambda: two_ranks.append("barrier"))
    eng.barrier()
    assert two_ranks == ["barrier"] and eng.rank_and_world() == (1, 2)


def _naive_digest(module):
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(name.encode() + p.detach().float().numpy().tobytes())
    return h.hexdigest()


def test_param_digests_hash_every_named_parameter():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    assert eng.param_digests(m) == [_naive_digest(m)]
    n = torch.nn.Linear(3, 2)
    n.load_state_dict(m.state_dict())
    assert eng.param_digests(n) == eng.param_digests(m)
    with torch.no_grad():
        n.bias[1] += 1e-6
    assert eng.param_digests(n) != eng.param_digests(m)
    half = torch.nn.Linear(3, 2).to(torch.bfloat16)  # hashed as float32 values
    assert eng.param_digests(half) == [_naive_digest(half)]


def test_param_digests_gather_every_ranks_digest(two_ranks, monkeypatch):
    m = torch.nn.Linear(3, 2)

    def all_gather_object(out, obj):
        two_ranks.append(obj)
        out[0], out[1] = "rank0", obj

    monkeypatch.setattr(eng.dist, "all_gather_object", all_gather_object)
    assert eng.param_digests(m) == ["rank0", _naive_digest(m)] and two_ranks == [_naive_digest(m)]


# ----------------------------------------------------------------------------------- the update's helpers
class _Recorder:
    """The parts of an engine `backward` and `reported_grad_norm` call."""

    def __init__(self, norm=None):
        self.calls, self.norm = [], norm

    def backward(self, loss, **kw):
        self.calls.append((loss, kw))

    def get_global_grad_norm(self):
        return self.norm


def test_backward_undoes_deepspeeds_rank_average_and_accumulation_scaling():
    e = _Recorder()
    eng.backward(e, torch.tensor(1.5), 4)
    assert e.calls == [(6.0, {"scale_wrt_gas": False})]


def test_reported_grad_norm_is_deepspeeds_when_it_has_one():
    assert eng.reported_grad_norm(_Recorder(norm=torch.tensor(2.5)), 7.0) == 2.5
    assert eng.reported_grad_norm(_Recorder(norm=0.0), 7.0) == 0.0
    assert eng.reported_grad_norm(_Recorder(norm=None), 7.0) == 7.0


def test_grad_norm_is_the_2_norm_of_all_gradients():
    m = torch.nn.Linear(2, 1)
    assert eng.grad_norm(m) == 0.0  # no gradient yet
    m.weight.grad = torch.tensor([[3.0, 0.0]])
    assert eng.grad_norm(m) == 3.0  # the bias has none
    m.bias.grad = torch.tensor([4.0])
    assert eng.grad_norm(m) == 5.0


def test_nan_loss_poisons_every_trained_gradient_and_no_frozen_one():
    m = torch.nn.Linear(2, 2)
    m.bias.requires_grad_(False)
    loss = eng.nan_loss(SimpleNamespace(module=m))
    assert loss.dim() == 0 and math.isnan(loss.item())
    loss.backward()
    assert torch.isnan(m.weight.grad).all() and m.bias.grad is None


def test_optimizer_step_at_a_finite_zero0_boundary_steps_once_with_the_norm():
    class E:
        def __init__(self):
            self.module, self.steps = torch.nn.Linear(2, 1), 0
            self.module.weight.grad = torch.tensor([[3.0, 4.0]])

        def is_gradient_accumulation_boundary(self):
            return True

        def step(self):
            self.steps += 1

    e = E()
    assert eng.optimizer_step(e, 0) == (True, 5.0) and e.steps == 1
    e = E()
    assert eng.optimizer_step(e, 1) == (True, None) and e.steps == 1


def test_step_without_update_on_a_real_zero0_engine_moves_nothing_but_the_step_counters():
    e = _make(zero_stage=0, grad_accum=1)
    _train(e, 0)
    before = eng.engine_state_dict(e)
    loss = e(torch.ones(2, 4)).pow(2).mean()
    e.backward(loss)
    eng.step_without_update(e)
    after = eng.engine_state_dict(e)
    assert all(torch.equal(after["module"][k], v) for k, v in before["module"].items())
    assert after["scheduler"] == before["scheduler"] and e.get_lr()[0] == pytest.approx(0.1 * 2 / 4)
    assert after["counters"]["skipped_steps"] == before["counters"]["skipped_steps"] + 1
    assert after["counters"]["global_steps"] == before["counters"]["global_steps"] + 1
    assert e._config.gradient_clipping == 0.5 and not hasattr(e.optimizer, "overflow")


# ---------------------------------------------------------------------------------- in-memory engine copy
def _opt_state(engine):
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(base.state.values())}


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_engine_state_dict_round_trips_weights_moments_schedule_and_counters(zero_stage):
    e = _make(zero_stage=zero_stage, grad_accum=1, warmup_steps=10)  # still warming up: each step has its own LR
    _train(e, 0, n=2)
    snap = eng.engine_state_dict(e)
    assert snap["counters"] == {"global_steps": 2, "global_samples": 4, "micro_steps": 2, "skipped_steps": 0}
    assert ("fp32_partitions" in snap) is (zero_stage == 1)
    weights, moments, lr = {k: v.clone() for k, v in e.module.state_dict().items()}, _opt_state(e), e.get_lr()[0]
    _train(e, 10, n=2)  # moves everything the copy holds
    after = {k: v.clone() for k, v in e.module.state_dict().items()}
    assert not torch.equal(after["weight"], weights["weight"]) and e.get_lr()[0] != lr
    e.module.weight.grad = torch.ones_like(e.module.weight)
    eng.load_engine_state_dict(e, snap)
    assert all(torch.equal(e.module.state_dict()[k], v) for k, v in weights.items())
    restored = _opt_state(e)
    assert all(torch.equal(restored[i][k], v) for i in moments for k, v in moments[i].items())
    assert e.get_lr()[0] == lr and e.lr_scheduler.last_epoch == 2
    assert (e.global_steps, e.micro_steps, e.global_samples, e.skipped_steps) == (2, 2, 4, 0)
    assert all(p.grad is None for p in e.module.parameters())
    # the same two steps from the restored state land on the same weights; the copy itself is untouched
    _train(e, 10, n=2)
    assert all(torch.equal(e.module.state_dict()[k], v) for k, v in after.items())
    assert torch.equal(snap["module"]["weight"], weights["weight"])


def test_engine_state_dict_restores_zero1_fp32_master_weights(zero1):
    snap = eng.engine_state_dict(zero1)
    master = [t.clone() for t in zero1.optimizer.single_partition_of_fp32_groups]
    with torch.no_grad():
        for t in zero1.optimizer.single_partition_of_fp32_groups:
            t.add_(1.0)
    eng.load_engine_state_dict(zero1, snap)
    assert all(torch.equal(t, m) for t, m in zip(zero1.optimizer.single_partition_of_fp32_groups, master))


def test_engine_state_dict_of_a_zero3_engine_is_refused():
    e = SimpleNamespace(zero_optimization_stage=lambda: 3)
    with pytest.raises(NotImplementedError, match=r"^in-memory rollback of a ZeRO-3 engine is not supported \(its "
                                                  r"weights are partitioned\); use engine.zero_stage <= 2$"):
        eng.engine_state_dict(e)


def test_engine_state_dict_without_a_scheduler():
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    e = SimpleNamespace(module=m, optimizer=opt, lr_scheduler=None, global_steps=1, global_samples=2, micro_steps=3,
                        skipped_steps=4)
    snap = eng.engine_state_dict(e)
    assert snap["scheduler"] is None and "fp32_partitions" not in snap
    e.global_steps = 9
    with torch.no_grad():
        m.weight.zero_()
    eng.load_engine_state_dict(e, snap)
    assert e.global_steps == 1 and torch.equal(m.weight, snap["module"]["weight"])
