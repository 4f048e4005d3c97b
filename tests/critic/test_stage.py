"""The critic stage on hand-built batches: GAE on the critics' mean vs a naive loop, shards, AsyPPO masks.

The critics here are fake engines (a value table per critic, a torch optimizer), so the stage's own logic is
tested without DeepSpeed; tests/critic/test_value_model.py trains real value models on DeepSpeed engines.
"""

from __future__ import annotations

import pytest
import torch

from credo.distributed.rollout import Sample
from credo.train.batch import Batch
from credo.families.critic.stage import CriticAdvantage, outcome_token_rewards, whiten


class TableCritic(torch.nn.Module):
    """V(state) = table[row of the sample, column]: a critic whose values the test sets by hand."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())
        self.rows: dict[tuple, int] = {}

    def forward(self, input_ids, attention_mask):
        idx = torch.tensor([self.rows[tuple(r.tolist())] for r in input_ids])
        return self.table[idx]


class FakeEngine:
    """What the stage calls on a DeepSpeed engine: module, backward, step, accumulation boundary."""

    def __init__(self, module, lr=0.5):
        self.module, self.opt, self.steps = module, torch.optim.SGD(module.parameters(), lr=lr), 0
        self.grad_rows: list[set] = []

    def backward(self, loss, scale_wrt_gas=False):
        loss.backward()

    def is_gradient_accumulation_boundary(self):
        return True

    def step(self):
        g = self.module.table.grad
        self.grad_rows.append(set(torch.nonzero(g.abs().sum(-1)).squeeze(1).tolist()) if g is not None else set())
        self.opt.step()
        self.opt.zero_grad()
        self.steps += 1

    def get_global_grad_norm(self):
        return None


def make_batch(lengths, prompt_len=2, rewards=None, group_ids=None, step=3):
    """Samples with distinct token ids (so a TableCritic can tell rows apart), packed by hand."""
    samples = []
    for i, n in enumerate(lengths):
        samples.append(Sample(prompt_ids=[100 + i] * prompt_len, response_ids=list(range(10, 10 + n)),
                              response_mask=[1] * n, rollout_log_probs=[-1.0] * n, finished=True))
    B, L = len(lengths), prompt_len + max(lengths)
    b = Batch(samples=samples, problems=[None] * B,
              group_ids=torch.tensor(group_ids if group_ids is not None else [0] * B), step=step)
    b.rewards = torch.tensor(rewards if rewards is not None else [float(i % 2) for i in range(B)])
    b.valid = torch.ones(B, dtype=torch.bool)
    from credo.train.batch import pack_batch

    pack_batch(b, pad_id=0, overlong_filter=False)
    assert b.input_ids.shape == (B, L)
    return b


def make_stage(tables, batch, **kw):
    engines = []
    for t in tables:
        mod = TableCritic(t)
        mod.rows = {tuple(r.tolist()): i for i, r in enumerate(batch.input_ids)}
        engines.append(FakeEngine(mod))
    args = dict(gae_kwargs={"gamma": 0.9, "lam": 0.8}, value_agg="mean", whiten=False, kl_in_reward=0.0, kl=None,
                low_frac=0.0, high_frac=0.0, value_clip=None, epochs=1, mini_batches=1, micro_batch_size=64,
                grad_accum=1, critic_only_steps=0, zero_stage=1, world=1)
    args.update(kw)
    return CriticAdvantage(engines, **args), engines


def naive_gae(rewards, values, mask, gamma, lam):
    """Per sample, walk the response tokens backwards (a plain loop over Python floats)."""
    B, T = mask.shape
    adv, ret = torch.zeros(B, T), torch.zeros(B, T)
    for i in range(B):
        cols = [t for t in range(T) if mask[i, t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(cols):
            delta = float(rewards[i, t]) + gamma * next_v - float(values[i, t])
            a = delta + gamma * lam * next_a
            adv[i, t], ret[i, t] = a, a + float(values[i, t])
            next_v, next_a = float(values[i, t]), a
    return adv, ret


def test_outcome_reward_sits_on_the_last_response_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    r = outcome_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    expected = torch.zeros(3, 4)
    expected[0, 2], expected[1, 3] = 2.0, -1.0  # a row without response tokens gets nothing
    assert torch.equal(r, expected)


def test_gae_on_the_mean_of_two_critics_matches_a_naive_loop():
    torch.manual_seed(0)
    batch = make_batch([3, 1, 4, 2], rewards=[1.0, 0.0, 1.0, 0.5], group_ids=[0, 0, 1, 1])
    T = batch.response_mask.shape[1]
    tables = [torch.randn(4, T), torch.randn(4, T)]
    stage, _ = make_stage(tables, batch)
    stage(batch)
    mask = batch.response_mask
    vbar = (tables[0] + tables[1]) / 2 * mask
    token_r = torch.zeros(4, T)
    for i in range(4):
        last = max(t for t in range(T) if mask[i, t])
        token_r[i, last] = batch.rewards[i]
    adv, _ = naive_gae(token_r, vbar, mask, 0.9, 0.8)
    torch.testing.assert_close(batch.advantages, adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch.values, vbar, rtol=1e-6, atol=1e-6)
    assert batch.weights is None and batch.entropy_mask is None and batch.train_policy


def test_each_critic_trains_only_on_its_shard_of_every_group():
    batch = make_batch([2, 2, 2, 2, 2, 2], rewards=[1.0] * 6, group_ids=[7, 3, 7, 3, 7, 3])
    T = batch.response_mask.shape[1]
    stage, engines = make_stage([torch.zeros(6, T), torch.zeros(6, T)], batch)
    stage(batch)
    # rank in group: sample 0,1 -> 0; 2,3 -> 1; 4,5 -> 2; critic = rank mod 2
    assert engines[0].grad_rows == [{0, 1, 4, 5}]
    assert engines[1].grad_rows == [{2, 3}]
    assert batch.metrics["critic/value_loss"] > 0


def test_critic_updates_move_values_towards_the_returns():
    batch = make_batch([3, 3, 3, 3], rewards=[1.0, 1.0, 0.0, 0.0], group_ids=[0, 0, 1, 1])
    T = batch.response_mask.shape[1]
    stage, engines = make_stage([torch.zeros(4, T)], batch, gae_kwargs={"gamma": 1.0, "lam": 1.0}, epochs=20)
    losses = []
    for _ in range(3):
        b = make_batch([3, 3, 3, 3], rewards=[1.0, 1.0, 0.0, 0.0], group_ids=[0, 0, 1, 1])
        stage(b)
        losses.append(b.metrics["critic/value_loss"])
    assert losses[2] < losses[1] < losses[0]
    assert b.metrics["critic/explained_variance"] > 0.9


def test_asyppo_masks_reach_weights_and_the_entropy_mask():
    torch.manual_seed(1)
    batch = make_batch([4, 4, 4, 4, 3], group_ids=[0, 0, 1, 1, 1])
    T = batch.response_mask.shape[1]
    tables = [torch.randn(5, T), torch.randn(5, T)]
    stage, _ = make_stage(tables, batch, low_frac=0.2, high_frac=0.4)
    stage(batch)
    m = batch.loss_mask
    sigma = ((tables[0] - tables[1]).abs() / 2)[m]
    n = int(m.sum())  # 19 tokens: floor(0.2 * 19) = 3 masked, floor(0.4 * 19) = 7 filtered
    w, e = batch.weights[m], batch.entropy_mask[m]
    assert int((w == 0).sum()) == 3 and int((~e).sum()) == 7
    assert sigma[w == 0].max() <= sigma[w == 1].min()
    assert sigma[~e].min() >= sigma[e].max()
    assert not batch.entropy_mask[~m].any() and (batch.weights[~m] == 0).all()
    assert abs(batch.metrics["asyppo/adv_masked_frac"] - 3 / n) < 1e-12
    assert abs(batch.metrics["asyppo/entropy_filtered_frac"] - 7 / n) < 1e-12


def test_critic_only_steps_hold_the_policy():
    batch = make_batch([2, 2], step=2)
    T = batch.response_mask.shape[1]
    stage, engines = make_stage([torch.zeros(2, T)], batch, critic_only_steps=2)
    stage(batch)
    assert not batch.train_policy and engines[0].steps == 1
    batch = make_batch([2, 2], step=3)
    stage(batch)
    assert batch.train_policy


def test_whitening_is_over_loss_tokens_and_off_by_default():
    x = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    w = whiten(x, mask)
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = (vals - vals.mean()) / vals.std(unbiased=True)
    torch.testing.assert_close(w[mask], expected, rtol=1e-5, atol=1e-6)
    assert (w[~mask] == 0).all()


def test_value_clip_bounds_the_critic_step_around_the_rollout_values():
    batch = make_batch([2, 2], rewards=[10.0, 10.0], group_ids=[0, 0])
    T = batch.response_mask.shape[1]
    stage, engines = make_stage([torch.zeros(2, T)], batch, gae_kwargs={"gamma": 1.0, "lam": 1.0}, value_clip=0.1,
                                epochs=5)
    stage(batch)
    # after the first step V moves past the clip range, where the clipped error is the larger: no more gradient
    assert batch.metrics["critic/vf_clipfrac"] > 0.5


def test_kl_in_reward_is_subtracted_on_every_response_token():
    torch.manual_seed(2)
    batch = make_batch([3, 2], rewards=[1.0, 0.0], group_ids=[0, 0])
    T = batch.response_mask.shape[1]
    table = torch.randn(2, T)
    kl = torch.randn(2, T)
    stage, _ = make_stage([table], batch, kl_in_reward=0.5, kl=lambda ids, attn, mask: kl.clone())
    stage(batch)
    mask = batch.response_mask
    token_r = -0.5 * kl * mask
    for i in range(2):
        last = max(t for t in range(T) if mask[i, t])
        token_r[i, last] += batch.rewards[i]
    adv, _ = naive_gae(token_r, table * mask, mask, 0.9, 0.8)
    torch.testing.assert_close(batch.advantages, adv, rtol=1e-5, atol=1e-6)


def test_empty_micro_batches_step_at_weight_zero():
    """More micro-steps than rows: the empty ones run one sample at weight 0, so the engine still takes grad_accum
    steps and the loss and the update equal those of a single micro-batch."""
    out = {}
    for grad_accum in (1, 4):
        batch = make_batch([3, 2], rewards=[1.0, 0.0], group_ids=[0, 0])
        T = batch.response_mask.shape[1]
        stage, engines = make_stage([torch.zeros(2, T)], batch, grad_accum=grad_accum)
        stage(batch)
        out[grad_accum] = (batch.metrics["critic/value_loss"], engines[0].module.table.detach().clone(),
                           engines[0].steps)
    assert out[4][2] == 4 and out[1][2] == 1
    assert out[4][0] == pytest.approx(out[1][0], rel=1e-6)
    # SGD steps on the micro-batches' gradients (the empty ones add none) move the table as one step does
    assert torch.allclose(out[4][1], out[1][1], atol=1e-6)
