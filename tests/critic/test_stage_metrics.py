"""The critic stage's logged metrics, options and state against hand-derived values: every `critic/*` key, the
mean and min aggregation, whitening, micro-batched value forwards, the update's mini-batch and epoch loops, the
engines' in-memory state and checkpoint files, and the helpers' edge cases (one token, no token, constant returns).

The critics are value tables on fake engines (tests/critic/test_stage.py); nothing here needs DeepSpeed.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from credo.families.critic.stage import (CKPT_TAG, CriticAdvantage, PolicyKL, explained_variance, masked_global_mean,
                                outcome_token_rewards, whiten)
from tests.critic.test_stage import FakeEngine, TableCritic, make_batch, make_stage, naive_gae


class NormEngine(FakeEngine):
    """A fake engine that reports a given global grad norm after each optimizer step, and records the losses it
    back-propagates."""

    def __init__(self, module, lr=0.5, norms=()):
        super().__init__(module, lr=lr)
        self.norms, self.losses = list(norms), []

    def backward(self, loss, scale_wrt_gas=False):
        self.losses.append((float(loss.detach()), scale_wrt_gas))
        loss.backward()

    def get_global_grad_norm(self):
        return self.norms.pop(0) if self.norms else None


def stage_with(engines, batch, **kw):
    for e in engines:
        e.module.rows = {tuple(r.tolist()): i for i, r in enumerate(batch.input_ids)}
    args = dict(gae_kwargs={"gamma": 0.9, "lam": 0.8}, value_agg="mean", whiten=False, kl_in_reward=0.0, kl=None,
                low_frac=0.0, high_frac=0.0, value_clip=None, epochs=1, mini_batches=1, micro_batch_size=64,
                grad_accum=1, critic_only_steps=0, zero_stage=1, world=1)
    args.update(kw)
    return CriticAdvantage(engines, **args)


def token_rewards(batch):
    mask = batch.response_mask & batch.valid[:, None]
    out = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        cols = [t for t in range(mask.shape[1]) if mask[i, t]]
        if cols:
            out[i, cols[-1]] = float(batch.rewards[i])
    return out


def masked(x, mask):
    return [float(v) for v, m in zip(x.flatten(), mask.flatten()) if m]


def mean(xs):
    return sum(xs) / len(xs)


def pvar(xs):
    mu = mean(xs)
    return sum((x - mu) ** 2 for x in xs) / len(xs)


# ------------------------------------------------------------------------------------------------ the step
def test_every_metric_of_a_two_critic_step_by_hand():
    """Two critics with lr 0 (values fixed through the update): each logged metric from its definition."""
    torch.manual_seed(3)
    batch = make_batch([3, 1, 4, 2], rewards=[1.0, 0.0, 1.0, 0.5], group_ids=[5, 5, 5, 5])
    T = batch.response_mask.shape[1]
    tables = [torch.randn(4, T), torch.randn(4, T)]
    engines = [NormEngine(TableCritic(t), lr=0.0, norms=n) for t, n in zip(tables, ([1.0, 2.0], [3.0, 6.0]))]
    stage = stage_with(engines, batch, mini_batches=2)
    stage(batch)
    mask = batch.response_mask
    vbar = (tables[0] + tables[1]) / 2 * mask
    adv, ret = naive_gae(token_rewards(batch), vbar, mask, 0.9, 0.8)
    r, v = masked(ret, mask), masked(vbar, mask)
    m = batch.metrics
    assert set(m) == {"critic/explained_variance", "critic/value_mean", "critic/return_mean", "critic/sigma_mean",
                      "critic/value_loss", "critic/vf_clipfrac", "critic/grad_norm", "perf/critic_s"}
    assert m["critic/explained_variance"] == pytest.approx(1 - pvar([a - b for a, b in zip(r, v)]) / pvar(r))
    assert m["critic/value_mean"] == pytest.approx(mean(v))
    assert m["critic/return_mean"] == pytest.approx(mean(r))
    assert m["critic/sigma_mean"] == pytest.approx(mean(masked((tables[0] - tables[1]).abs() / 2, mask)))
    # one group of 4: ranks 0..3, critic = rank mod 2 -> critic 0 fits rows 0 and 2, critic 1 rows 1 and 3; two
    # mini-batches of one row each, every step's loss is 0.5 * the row's mean squared error of its own critic
    row_losses = []
    for i in range(4):
        cols = [t for t in range(T) if mask[i, t]]
        row_losses.append(mean([0.5 * (float(tables[i % 2][i, t]) - float(ret[i, t])) ** 2 for t in cols]))
    assert m["critic/value_loss"] == pytest.approx(mean(row_losses), rel=1e-5)
    assert m["critic/vf_clipfrac"] == 0.0  # no clip range
    assert m["critic/grad_norm"] == pytest.approx((1 + 2 + 3 + 6) / 4)
    assert 0 < m["perf/critic_s"] < 60
    assert [len(e.losses) for e in engines] == [2, 2] and all(not s for e in engines for _, s in e.losses)
    torch.testing.assert_close(batch.advantages, adv, rtol=1e-5, atol=1e-6)


def test_no_grad_norm_key_without_norms_and_the_loss_averages_over_epochs():
    """lr 0 again: three epochs of the same loss average to that loss (the divisor counts the epochs)."""
    torch.manual_seed(4)
    batch = make_batch([2, 3], rewards=[1.0, -1.0], group_ids=[0, 0])
    T = batch.response_mask.shape[1]
    table = torch.randn(2, T)
    out = {}
    for epochs in (1, 3):
        engine = NormEngine(TableCritic(table), lr=0.0)
        b = make_batch([2, 3], rewards=[1.0, -1.0], group_ids=[0, 0])
        stage_with([engine], b, epochs=epochs)(b)
        out[epochs] = b.metrics
        assert engine.steps == epochs and "critic/grad_norm" not in b.metrics
    mask = batch.response_mask
    _, ret = naive_gae(token_rewards(batch), table * mask, mask, 0.9, 0.8)
    want = mean([0.5 * (a - b) ** 2 for a, b in zip(masked(table, mask), masked(ret, mask))])
    assert out[1]["critic/value_loss"] == pytest.approx(want, rel=1e-5)
    assert out[3]["critic/value_loss"] == pytest.approx(want, rel=1e-5)


def test_the_world_size_scales_the_backpropagated_loss():
    batch = make_batch([2, 2], rewards=[1.0, 0.0], group_ids=[0, 0])
    T = batch.response_mask.shape[1]
    losses = {}
    for world in (1, 3):
        engine = NormEngine(TableCritic(torch.zeros(2, T)), lr=0.0)
        b = make_batch([2, 2], rewards=[1.0, 0.0], group_ids=[0, 0])
        stage_with([engine], b, world=world)(b)
        losses[world] = engine.losses[0][0]
    assert losses[3] == pytest.approx(3 * losses[1]) and losses[1] > 0


def test_min_aggregation_takes_the_lower_critic_per_token():
    torch.manual_seed(5)
    batch = make_batch([3, 2, 4], rewards=[1.0, 0.0, 1.0], group_ids=[0, 0, 0])
    T = batch.response_mask.shape[1]
    tables = [torch.randn(3, T), torch.randn(3, T)]
    stage = stage_with([NormEngine(TableCritic(t), lr=0.0) for t in tables], batch, value_agg="min")
    stage(batch)
    mask = batch.response_mask
    vmin = torch.minimum(tables[0], tables[1]) * mask
    torch.testing.assert_close(batch.values, vmin)
    adv, _ = naive_gae(token_rewards(batch), vmin, mask, 0.9, 0.8)
    torch.testing.assert_close(batch.advantages, adv, rtol=1e-5, atol=1e-6)


def test_whitened_advantages_have_zero_mean_and_unit_std_over_loss_tokens():
    """An invalid sample keeps response tokens but no loss tokens: its advantage is 0 and it is left out of the
    whitening statistics, of the critics' fit and of the reward."""
    torch.manual_seed(6)
    batch = make_batch([3, 2, 4], rewards=[1.0, 0.0, 7.0], group_ids=[0, 0, 0])
    batch.valid = torch.tensor([True, True, False])
    batch.loss_mask = batch.response_mask & batch.valid[:, None]
    T = batch.response_mask.shape[1]
    table = torch.randn(3, T)
    stage = stage_with([NormEngine(TableCritic(table), lr=0.0)], batch, whiten=True)
    stage(batch)
    fit = batch.loss_mask
    adv, ret = naive_gae(token_rewards(batch), table * fit, fit, 0.9, 0.8)
    a = torch.tensor(masked(adv, fit), dtype=torch.float64)
    want = (a - a.mean()) / a.std(unbiased=True)
    torch.testing.assert_close(batch.advantages[fit].double(), want, rtol=1e-5, atol=1e-6)
    assert (batch.advantages[~fit] == 0).all() and (batch.values[2] == 0).all()
    assert batch.metrics["critic/return_mean"] == pytest.approx(mean(masked(ret, fit)), rel=1e-6)


def test_unwhitened_advantages_are_zero_off_the_loss_mask():
    torch.manual_seed(7)
    batch = make_batch([3, 2], rewards=[1.0, 1.0], group_ids=[0, 0])
    batch.loss_mask = batch.loss_mask.clone()
    batch.loss_mask[1] = False  # e.g. DAPO's overlong filter: response tokens the critic fits, no policy loss
    T = batch.response_mask.shape[1]
    table = torch.randn(2, T)
    stage_with([NormEngine(TableCritic(table), lr=0.0)], batch)(batch)
    mask = batch.response_mask
    adv, _ = naive_gae(token_rewards(batch), table * mask, mask, 0.9, 0.8)
    torch.testing.assert_close(batch.advantages, adv * batch.loss_mask, rtol=1e-5, atol=1e-6)
    assert (batch.values[1][mask[1]] != 0).all()  # the critic still values row 1


def test_value_forwards_run_in_micro_batches_of_the_given_size():
    batch = make_batch([2, 2, 2, 2, 2], rewards=[1.0] * 5, group_ids=[0] * 5)
    T = batch.response_mask.shape[1]
    module = TableCritic(torch.zeros(5, T))
    sizes = []
    forward = module.forward
    module.forward = lambda ids, attn: sizes.append(ids.shape[0]) or forward(ids, attn)
    stage = stage_with([NormEngine(module, lr=0.0)], batch, micro_batch_size=2)
    with torch.no_grad():
        values = stage.values(batch.input_ids, batch.attention_mask, batch.response_mask)
    assert sizes == [2, 2, 1]
    assert values.shape == (1, 5, T) and values.dtype == torch.float32


def test_asyppo_keep_mask_multiplies_existing_weights():
    torch.manual_seed(1)
    batch = make_batch([4, 4, 4, 4, 3], group_ids=[0, 0, 1, 1, 1])
    batch.weights = torch.full(batch.loss_mask.shape, 2.0)
    T = batch.response_mask.shape[1]
    tables = [torch.randn(5, T), torch.randn(5, T)]
    stage, _ = make_stage(tables, batch, low_frac=0.2, high_frac=0.0)
    stage(batch)
    m = batch.loss_mask
    assert int((batch.weights[m] == 0).sum()) == 3 and int((batch.weights[m] == 2).sum()) == int(m.sum()) - 3
    assert set(batch.weights.unique().tolist()) == {0.0, 2.0}
    # high_frac = 0: no token loses its entropy bonus
    assert batch.entropy_mask[m].all() and batch.metrics["asyppo/entropy_filtered_frac"] == 0.0
    assert batch.metrics["asyppo/adv_masked_frac"] == pytest.approx(3 / int(m.sum()))


def test_high_frac_alone_turns_the_masks_on():
    torch.manual_seed(1)
    batch = make_batch([4, 4, 4, 4, 3], group_ids=[0, 0, 1, 1, 1])
    T = batch.response_mask.shape[1]
    stage, _ = make_stage([torch.randn(5, T), torch.randn(5, T)], batch, low_frac=0.0, high_frac=0.4)
    stage(batch)
    m = batch.loss_mask
    assert int((~batch.entropy_mask[m]).sum()) == 7  # floor(0.4 * 19)
    assert torch.equal(batch.weights, m.float())  # nothing masked from the advantage, 0 off the loss mask
    assert batch.metrics["asyppo/adv_masked_frac"] == 0.0


def test_kl_in_reward_calls_the_kl_with_the_fitted_mask():
    batch = make_batch([3, 2], rewards=[1.0, 0.0], group_ids=[0, 0])
    batch.valid = torch.tensor([True, False])
    T = batch.response_mask.shape[1]
    seen = []

    def kl(ids, attn, mask):
        seen.append((ids, attn, mask))
        return torch.ones(ids.shape[0], T)

    stage_with([NormEngine(TableCritic(torch.zeros(2, T)), lr=0.0)], batch, kl_in_reward=0.25, kl=kl)(batch)
    (ids, attn, mask), = seen
    assert torch.equal(ids, batch.input_ids) and torch.equal(attn, batch.attention_mask)
    assert torch.equal(mask, batch.response_mask & torch.tensor([[True], [False]]))
    # zero values, gamma 0.9 lam 0.8: the advantage of the last token is its reward, 1 - 0.25
    last = max(t for t in range(T) if mask[0, t])
    assert float(batch.advantages[0, last]) == pytest.approx(0.75)


# ------------------------------------------------------------------------------------------------ PolicyKL
def test_policy_kl_is_the_policy_minus_the_reference_log_probs():
    calls = []

    def scorer(model, ids, attn, mask, **kw):
        calls.append((model, kw))
        return (torch.full(ids.shape, 3.0) if model == "policy" else torch.full(ids.shape, 1.0)), None

    engine = type("E", (), {"module": "policy"})()
    kl = PolicyKL(scorer, engine, "ref")
    ids = torch.zeros(2, 3, dtype=torch.long)
    out = kl(ids, torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    assert torch.equal(out, torch.full((2, 3), 2.0))
    assert calls == [("policy", {"with_entropy": False}), ("ref", {"with_entropy": False, "hidden_path": True})]
    assert (kl.scorer, kl.engine, kl.ref_model) == (scorer, engine, "ref")


# ------------------------------------------------------------------------------------------------ state
class StatefulEngine(FakeEngine):
    """A fake engine with what `engine_state_dict` copies, and DeepSpeed's checkpoint calls recorded."""

    def __init__(self, module, load_path="loaded"):
        super().__init__(module)
        self.optimizer, self.lr_scheduler = self.opt, None
        self.global_steps = self.global_samples = self.micro_steps = self.skipped_steps = 0
        self.saved, self.loaded, self.load_path = [], [], load_path

    def save_checkpoint(self, path, **kw):
        self.saved.append((path, kw))

    def load_checkpoint(self, path, **kw):
        self.loaded.append((path, kw))
        return self.load_path, {}


def test_state_dict_round_trip_restores_every_critic():
    engines = [StatefulEngine(TableCritic(torch.full((2, 3), float(m)))) for m in range(2)]
    stage = stage_with(engines, make_batch([2, 2]))
    state = stage.state_dict()
    assert list(state) == ["critics"] and len(state["critics"]) == 2
    for e in engines:
        with torch.no_grad():
            e.module.table.add_(5.0)
    stage.load_state_dict(state)
    assert [float(e.module.table.detach().mean()) for e in engines] == [0.0, 1.0]
    with pytest.raises(ValueError):  # one copy per engine, strictly
        stage.load_state_dict({"critics": state["critics"][:1]})


def test_checkpoint_files_per_critic_and_their_digests(tmp_path):
    from credo.distributed.engine import param_digests

    engines = [StatefulEngine(TableCritic(torch.full((2, 3), float(m)))) for m in range(2)]
    stage = stage_with(engines, make_batch([2, 2]))
    out = stage.save_files(tmp_path)
    assert CKPT_TAG == "state"
    for m, e in enumerate(engines):
        assert e.saved == [(str(tmp_path / f"critic_{m}"), {"tag": "state", "save_latest": False})]
    assert out == {"param_digests": [param_digests(e.module) for e in engines]}
    assert out["param_digests"][0] != out["param_digests"][1] and len(out["param_digests"][0]) == 1
    stage.load_files(tmp_path)
    for m, e in enumerate(engines):
        assert e.loaded == [(str(tmp_path / f"critic_{m}"), {"tag": "state", "load_optimizer_states": True,
                                                             "load_lr_scheduler_states": True})]


def test_a_critic_deepspeed_cannot_load_is_named(tmp_path):
    engines = [StatefulEngine(TableCritic(torch.zeros(2, 3))), StatefulEngine(TableCritic(torch.zeros(2, 3)), None)]
    stage = stage_with(engines, make_batch([2, 2]))
    with pytest.raises(RuntimeError, match="^" + re.escape(f"DeepSpeed could not load critic 1 from {tmp_path}/critic_1") + "$"):
        stage.load_files(tmp_path)


def test_ranks_with_different_critic_parameters_fail_the_save(tmp_path, monkeypatch):
    """Two ranks faked in process: rank 1 reports another digest of critic 0."""
    import torch.distributed as dist

    from credo.train.state import TrainingError

    def all_gather_object(out, obj):
        out[0], out[1] = obj, "other"

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    engines = [StatefulEngine(TableCritic(torch.zeros(2, 3)))]
    stage = stage_with(engines, make_batch([2, 2]))
    with pytest.raises(TrainingError, match=r"^data-parallel ranks hold different parameters of critic 0: \['[0-9a-f]{64}', 'other'\]$"):
        stage.save_files(tmp_path)


# ------------------------------------------------------------------------------------------------ helpers
def test_outcome_rewards_are_float32_from_any_reward_dtype():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 1]], dtype=torch.bool)
    out = outcome_token_rewards(torch.tensor([0.1, 2.0, -3.0], dtype=torch.float64), mask)
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.0, pytest.approx(0.1), 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -3.0]]


def test_whiten_of_one_token_only_masks_and_of_two_is_plus_minus_one_over_root_two():
    x = torch.tensor([[4.0, 9.0, 1.0]])
    one = torch.tensor([[False, True, False]])
    assert whiten(x, one).tolist() == [[0.0, 9.0, 0.0]]  # a single token has no spread: left as is
    two = torch.tensor([[True, False, True]])
    got = whiten(x, two)
    assert got[0, 0].item() == pytest.approx(2 ** -0.5, rel=1e-6) and got[0, 2].item() == pytest.approx(-2 ** -0.5, rel=1e-6)
    assert got[0, 1].item() == 0.0


def test_whiten_of_equal_values_is_zero_and_of_tiny_spread_is_not_amplified_past_the_epsilon():
    x = torch.tensor([[2.0, 2.0, 2.0]], dtype=torch.float64)
    assert whiten(x, torch.ones(1, 3, dtype=torch.bool)).tolist() == [[0.0, 0.0, 0.0]]
    # spread 1e-5: unbiased variance 1e-10 next to the 1e-8 epsilon
    y = torch.tensor([[0.0, 1e-5]], dtype=torch.float64)
    got = whiten(y, torch.ones(1, 2, dtype=torch.bool))
    var = (1e-5) ** 2 / 2
    assert got[0, 1].item() == pytest.approx(0.5e-5 / math.sqrt(var + 1e-8), rel=1e-9)


def test_masked_mean_of_nothing_is_zero():
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    assert masked_global_mean(x, torch.zeros(2, 2, dtype=torch.bool)) == 0.0
    assert masked_global_mean(x, torch.tensor([[False, True], [True, True]])) == pytest.approx(10 / 3)


def test_explained_variance_edge_cases():
    r = torch.tensor([[1.0, 2.0, 4.0]])
    assert math.isnan(explained_variance(r, r, torch.zeros(1, 3, dtype=torch.bool)))  # no token
    assert math.isnan(explained_variance(torch.full((1, 3), 2.0), r, torch.ones(1, 3, dtype=torch.bool)))
    one = torch.tensor([[True, False, False]])
    assert math.isnan(explained_variance(r, r, one))  # one token: Var(returns) = 0
    # a small but real spread of the returns (Var 1e-6) is still explained
    small = torch.tensor([[0.0, 2e-3]], dtype=torch.float64)
    both = torch.ones(1, 2, dtype=torch.bool)
    assert explained_variance(small, small * 0.5, both) == pytest.approx(0.75, rel=1e-6)
    assert explained_variance(r, r, torch.ones(1, 3, dtype=torch.bool)) == pytest.approx(1.0)


class DriftCritic(TableCritic):
    """Values `table` at rollout time (no grad) and `table + drift` inside the update (grad on): the critic looks
    as if it had moved since the rollout, so the value clip has something to clip."""

    def __init__(self, table, drift):
        super().__init__(table)
        self.drift = drift

    def forward(self, input_ids, attention_mask):
        v = super().forward(input_ids, attention_mask)
        if torch.is_grad_enabled():
            idx = torch.tensor([self.rows[tuple(r.tolist())] for r in input_ids])
            v = v + self.drift[idx]
        return v


def naive_clipped(v_old, drift, ret, mask, clip, rows):
    """Per token of `rows`: the clipped loss 0.5 max((V - R)^2, (V_clip - R)^2) and whether the clipped error is
    strictly the larger."""
    out = []
    for i in rows:
        for t in range(mask.shape[1]):
            if mask[i, t]:
                old, r = float(v_old[i, t]), float(ret[i, t])
                v = old + float(drift[i, t])
                vc = min(max(v, old - clip), old + clip)
                out.append((0.5 * max((v - r) ** 2, (vc - r) ** 2), (vc - r) ** 2 > (v - r) ** 2))
    return out


def test_clip_fraction_counts_tokens_over_micro_batches_of_different_sizes():
    """Rows of 4 and 1 tokens in two micro-batches: vf_clipfrac is clipped tokens / tokens (not a mean of the
    micro-batches' fractions), and the loss is the token mean of the clipped losses."""
    torch.manual_seed(8)
    batch = make_batch([4, 1], rewards=[1.0, -1.0], group_ids=[0, 0])
    T = batch.response_mask.shape[1]
    table = torch.randn(2, T)
    mask = batch.response_mask
    drift = torch.randn(2, T) * 0.4 * mask
    engine = NormEngine(DriftCritic(table, drift), lr=0.0)
    stage_with([engine], batch, grad_accum=2, value_clip=0.2)(batch)
    _, ret = naive_gae(token_rewards(batch), table * mask, mask, 0.9, 0.8)
    toks = naive_clipped(table, drift, ret, mask, 0.2, [0, 1])
    assert batch.metrics["critic/vf_clipfrac"] == pytest.approx(sum(c for _, c in toks) / 5)
    assert 0 < batch.metrics["critic/vf_clipfrac"] < 1
    assert batch.metrics["critic/value_loss"] == pytest.approx(sum(x for x, _ in toks) / 5, rel=1e-5)


def test_clip_fraction_of_a_single_clipped_token_is_one():
    batch = make_batch([1], rewards=[1.0], group_ids=[0])
    T = batch.response_mask.shape[1]
    table = torch.zeros(1, T)
    drift = batch.response_mask.float() * 0.5  # towards the return 1, past the clip: the clipped error is larger
    engine = NormEngine(DriftCritic(table, drift), lr=0.0)
    stage_with([engine], batch, value_clip=0.1)(batch)
    assert batch.metrics["critic/vf_clipfrac"] == 1.0
    assert batch.metrics["critic/value_loss"] == pytest.approx(0.5 * 0.9 ** 2)  # V_clip = 0.1, R = 1
