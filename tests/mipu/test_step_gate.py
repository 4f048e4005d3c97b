"""MIPU's trainer side (credo.families.mipu.gate) by hand: the gate's defaults and error messages, its rollback window
state, the random control's draws, T_post's validation plumbing (which prompts, seeds, groups, masks and
advantages) with recording stand-ins for the backend, reward, scorer and tokenizer, and the step's mismatch
metrics against a naive loop. No model: milliseconds."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from credo.distributed.rollout import Sample
from credo.train.batch import Batch
from credo.families.mipu.gate import VAL_SALT, WINDOW, StepGate
from credo.train.mismatch import gather_ragged, step_mismatch_metrics
from credo.train.rollout import step_seed
from tests.mipu.test_gate_unit import FakeSource, FakeState


def test_constants():
    assert WINDOW == 100 and VAL_SALT == -1_000_000


def test_defaults_of_an_off_gate():
    sampling = {"max_new_tokens": 4}
    g = StepGate(mode=None, state="state", source="source", sampling=sampling)
    assert (g.mode, g.state, g.source, g.backend, g.reward, g.scorer, g.engine, g.tokenizer, g.render) == (
        None, "state", "source", None, None, None, None, None, None)
    assert (g.val_problems, g.G, g.c_start, g.c_end, g.anneal_steps, g.rollback_prob, g.seed, g.rank, g.world) == (
        [], 4, 0.0, 0.0, 100, 0.0, 0, 0, 1)
    assert g.sampling == sampling and g.sampling is not sampling
    assert StepGate(mode=None, state=None, source=None).sampling == {}
    assert list(g.decisions) == [] and g.decisions.maxlen == WINDOW


def test_error_messages():
    with pytest.raises(ValueError, match=r"^mode is 'grpo', expected None, 'mipu' or 'random'$"):
        StepGate(mode="grpo", state=None, source=None)
    with pytest.raises(ValueError, match="^" + re.escape(
            "a validation set of 0 prompts x 4 responses cannot form one group: expected mipu.val_prompts >= 1 "
            "and mipu.val_group_size >= 2") + "$"):
        StepGate(mode="mipu", state=None, source=None)
    with pytest.raises(ValueError, match=r"^a validation set of 2 prompts x 1 responses cannot form one group"):
        StepGate(mode="mipu", state=None, source=None, val_problems=["a", "b"], val_group_size=1)
    with pytest.raises(ValueError, match="^" + re.escape(
            "mipu.val_prompts = 3 must be divisible by the number of processes (2)") + "$"):
        StepGate(mode="mipu", state=None, source=None, val_problems=["a"] * 3, val_group_size=2, world=2)
    # the smallest valid set: one prompt, a group of two; a random gate needs no validation set
    StepGate(mode="mipu", state=None, source=None, val_problems=["a"], val_group_size=2)
    StepGate(mode="mipu", state=None, source=None, val_problems=["a"] * 4, val_group_size=2, world=2)
    StepGate(mode="random", state=None, source=None, world=3)


def test_rollback_window_state_round_trip():
    g = StepGate(mode="random", state=FakeState(), source=FakeSource())
    assert g.state_dict() == {"decisions": []}
    g.load_state_dict({"decisions": [1, 0, 1]})
    assert g.state_dict() == {"decisions": [1, 0, 1]}
    g.load_state_dict({})  # a checkpoint from before the window was saved
    assert list(g.decisions) == []
    g.load_state_dict({"decisions": [1] * 30 + [0] * WINDOW})
    assert list(g.decisions) == [0] * WINDOW and g.decisions.maxlen == WINDOW


def test_random_control_draws_by_hand():
    g = StepGate(mode="random", state=FakeState(), source=FakeSource(), engine=SimpleNamespace(module="policy"),
                 rollback_prob=0.5, seed=11)
    rows = [g.decide(s, {"s": s}) for s in range(1, 13)]
    want = [float(torch.rand((), generator=torch.Generator().manual_seed(step_seed(11, s, -1_000_001))) >= 0.5)
            for s in range(1, 13)]
    assert [r["mipu/accepted"] for r in rows] == want and 0 < sum(want) < 12
    assert all(set(r) == {"mipu/accepted", "mipu/rollback_rate"} for r in rows)
    assert rows[-1]["mipu/rollback_rate"] == pytest.approx(1 - sum(want) / 12)
    rejected = [s for s, a in zip(range(1, 13), want) if not a]
    assert g.state.restored == [{"s": s} for s in rejected] and g.source.synced == rejected
    never = StepGate(mode="random", state=FakeState(), source=FakeSource())  # rollback_prob 0: always accepted
    assert all(never.decide(s, None)["mipu/accepted"] == 1.0 for s in range(1, 30))


def test_a_rejection_resyncs_the_engines_module():
    source = FakeSource()
    source.sync = lambda model, step: source.synced.append((model, step))
    g = StepGate(mode="mipu", state=FakeState(), source=source, engine=SimpleNamespace(module="policy"),
                 val_problems=["p"], val_group_size=2, c_start=0.5, c_end=0.5)
    g.t_post = lambda step: (-0.75, 0.25)
    row = g.decide(3, {"snap": 1})
    assert row == {"mipu/t_post": -0.75, "mipu/c_k": 0.5, "mipu/val_reward_mean": 0.25, "mipu/accepted": 0.0,
                   "mipu/rollback_rate": 1.0}
    assert source.synced == [("policy", 3)] and g.state.restored == [{"snap": 1}]


# --------------------------------------------------------------------------------------------- T_post
class Recorder:
    """Stand-ins for what the gate receives: tokenizer, backend, reward stage and scorer, each recording."""

    def __init__(self, rewards, valid, deltas):
        self.rewards, self.valid, self.deltas = rewards, valid, deltas
        self.tokenized, self.generated, self.rewarded, self.scored = [], [], [], []
        self.pad_token_id = 0

    def __call__(self, texts, add_special_tokens=True):  # the tokenizer
        self.tokenized.append((list(texts), add_special_tokens))
        return {"input_ids": [[10 + len(t), 20 + len(t)] for t in texts]}

    def generate(self, prompts, seeds, **sampling):
        self.generated.append((prompts, seeds, sampling))
        return [Sample(prompt_ids=list(p), response_ids=[3 + i, 4, 5][: 2 + i % 2], response_mask=[1] * (2 + i % 2),
                       rollout_log_probs=[-0.5 - 0.1 * i] * (2 + i % 2), finished=True) for i, p in enumerate(prompts)]

    def reward(self, batch):
        self.rewarded.append(batch)
        batch.rewards = torch.tensor(self.rewards)
        batch.valid = torch.tensor(self.valid)

    def scorer(self, model, ids, attn, mask, with_entropy):
        self.scored.append((model, ids, attn, mask, with_entropy))
        _, _, _, mu = pack_of(self.generated[-1])
        return (mu + torch.tensor(self.deltas)[:, None]) * mask, None


def pack_of(generated):
    from credo.train.batch import pack

    prompts, seeds, sampling = generated
    return pack(Recorder.generate(Recorder([], [], []), prompts, seeds), 0)


def make_gate(rec, **kw):
    args = dict(mode="mipu", state=FakeState(), source=FakeSource(), backend=rec, reward=rec.reward,
                scorer=rec.scorer, engine=SimpleNamespace(module=torch.nn.Linear(1, 1)), tokenizer=rec,
                render=lambda p: f"<{p}>", val_problems=["aa", "b", "cccc", "ddd"], val_group_size=2, seed=5,
                rank=1, world=2, sampling={"max_new_tokens": 3, "temperature": 0.9})
    args.update(kw)
    return StepGate(**args)


def test_t_post_of_this_ranks_share_by_hand():
    """Rank 1 of 2 validates prompts 2 and 3 ('cccc', 'ddd'), two responses each; the last response has an
    invalid reward (no token counts); log pi - log mu is a constant delta per response."""
    deltas = [0.1, -0.2, 0.0, 0.3]
    rec = Recorder(rewards=[1.0, 0.0, 3.0, 0.0], valid=[True, True, True, False], deltas=deltas)
    g = make_gate(rec)
    t_post, reward_mean = g.t_post(7)
    assert rec.tokenized == [(["<cccc>", "<ddd>"], False)]
    (prompts, seeds, sampling), = rec.generated
    assert prompts == [[16, 26], [16, 26], [15, 25], [15, 25]]
    assert seeds == [step_seed(5, 7, -1_000_000 + k) for k in (4, 5, 6, 7)]
    assert sampling == {"max_new_tokens": 3, "temperature": 0.9}
    batch, = rec.rewarded
    assert batch.problems == ["cccc", "cccc", "ddd", "ddd"] and batch.group_ids.tolist() == [2, 2, 3, 3]
    assert batch.step == 7 and len(batch.samples) == 4
    model, ids, attn, mask, with_entropy = rec.scored[0]
    assert model is g.engine.module and with_entropy is False
    _, _, resp, _ = pack_of(rec.generated[0])
    assert torch.equal(mask, resp & torch.tensor([[True], [True], [True], [False]]))
    # group-relative advantages (unbiased std + 1e-6): group 2 rewards (1, 0), group 3 (3, 0)
    a = [0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6), 1.5 / (math.sqrt(4.5) + 1e-6)]
    want = -sum(math.exp(d) * ai for d, ai in zip(deltas, a)) / 3
    assert t_post == pytest.approx(want, rel=1e-6)
    assert reward_mean == pytest.approx(4.0 / 3)


def test_decide_runs_t_post_and_logs_the_validation_reward():
    rec = Recorder(rewards=[1.0, 0.0, 3.0, 0.0], valid=[True, True, True, False], deltas=[0.1, -0.2, 0.0, 0.3])
    g = make_gate(rec, c_start=1.0, c_end=1.0)
    row = g.decide(7, {"snap": 7})
    assert row["mipu/accepted"] == 1.0 and row["mipu/c_k"] == 1.0
    assert row["mipu/val_reward_mean"] == pytest.approx(4.0 / 3) and row["mipu/t_post"] == pytest.approx(g.t_post(7)[0])


def test_t_post_without_a_valid_response_is_an_error():
    rec = Recorder(rewards=[0.0] * 4, valid=[False] * 4, deltas=[0.0] * 4)
    with pytest.raises(ValueError, match="^" + re.escape(
            "step 3: no validation response has a valid reward and a token; T_post cannot be estimated (check the "
            "reward function)") + "$"):
        make_gate(rec).t_post(3)


def test_rank_zero_validates_the_first_share():
    rec = Recorder(rewards=[1.0, 0.0], valid=[True, True], deltas=[0.0, 0.0])
    g = make_gate(rec, rank=0, world=4)
    t_post, reward_mean = g.t_post(2)
    assert rec.tokenized == [(["<aa>"], False)]
    assert rec.generated[0][1] == [step_seed(5, 2, -1_000_000), step_seed(5, 2, -999_999)]
    assert rec.rewarded[0].group_ids.tolist() == [0, 0]
    assert t_post == pytest.approx(0.0, abs=1e-12) and reward_mean == 0.5  # rho = 1, advantages +a and -a


# --------------------------------------------------------------------------------------------- mismatch
def mismatch_batch(sampler):
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    b = Batch(samples=[SimpleNamespace(rollout_log_probs=lp) for lp in sampler], problems=[None] * 3,
              group_ids=torch.arange(3))
    b.loss_mask = mask
    b.rollout_log_probs = torch.tensor([[9.0, -1.0, -2.0, -0.5], [9.0, 9.0, -3.0, 9.0], [9.0] * 4])
    return b


def test_step_mismatch_metrics_by_hand():
    batch = mismatch_batch([[-1.0], [-3.0], []])
    pi_old = torch.tensor([[-7.0, -1.2, -1.5, -0.5], [5.0, 5.0, -2.0, 5.0], [5.0] * 4], requires_grad=True)
    got = step_mismatch_metrics(batch, pi_old)
    d = [-0.2, 0.5, 0.0, 1.0]  # log pi - log mu on the 4 loss tokens
    r = [math.exp(x) for x in d]
    assert set(got) == {"mismatch/k3", "mismatch/log_ratio_p1", "mismatch/log_ratio_p50", "mismatch/log_ratio_p99",
                        "mismatch/ess", "mismatch/max_ratio"}
    assert got["mismatch/k3"] == pytest.approx(sum(ri - 1 - di for ri, di in zip(r, d)) / 4, rel=1e-6)
    assert got["mismatch/log_ratio_p50"] == pytest.approx(float(np.percentile(d, 50)), rel=1e-6)
    assert got["mismatch/log_ratio_p1"] == pytest.approx(float(np.percentile(d, 1)), rel=1e-6)
    assert got["mismatch/ess"] == pytest.approx(sum(r) ** 2 / (4 * sum(x * x for x in r)), rel=1e-6)
    assert got["mismatch/max_ratio"] == pytest.approx(math.e, rel=1e-6)


def test_no_sampler_log_probs_no_metrics():
    assert step_mismatch_metrics(mismatch_batch([[], None, []]), torch.zeros(3, 4)) == {}


@pytest.mark.parametrize("where", ["trainer", "sampler"])
def test_a_non_finite_log_prob_on_a_loss_token_makes_every_metric_nan(where):
    batch = mismatch_batch([[-1.0], [], []])
    pi_old = torch.full((3, 4), -1.0)
    pi_old[0, 0] = float("inf")  # off the loss mask: ignored
    assert all(math.isfinite(v) for v in step_mismatch_metrics(batch, pi_old).values())
    if where == "trainer":
        pi_old[1, 2] = float("nan")
    else:
        batch.rollout_log_probs[0, 3] = float("-inf")
    got = step_mismatch_metrics(batch, pi_old)
    assert len(got) == 6 and all(math.isnan(v) for v in got.values())


def test_gather_ragged_in_a_world_of_one_is_the_tensor_itself():
    x = torch.tensor([1.0, 2.0])
    assert gather_ragged(x) is x
