"""Advantage estimators against their naive references, degenerate groups and hand-worked cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from credo.algos import ADVANTAGE_ESTIMATORS, ADVANTAGE_INPUTS, gae, normalize_rewards, rebn, turn_returns
from tests.algos._inputs import make_mask
from tests.reference_registry import REFERENCES, extra_kwargs, load_registries

load_registries()
OUTCOME = sorted(n for n, kind in ADVANTAGE_INPUTS.items() if kind == "outcome")
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def test_every_estimator_has_a_known_input_kind():
    # A new non-outcome kind needs its own reference test below; outcome ones are tested generically.
    assert set(ADVANTAGE_INPUTS.values()) <= {"outcome", "token_rewards_values", "turn_rewards"}
    assert set(ADVANTAGE_INPUTS) == set(ADVANTAGE_ESTIMATORS)


@st.composite
def outcome_batch(draw):
    B = draw(st.integers(1, 10))
    T = draw(st.integers(1, 5))
    # non-contiguous, unequal group ids (some groups singletons)
    group_ids = draw(st.lists(st.sampled_from([3, 7, 11, -2]), min_size=B, max_size=B))
    kind = draw(st.sampled_from(["binary", "gaussian", "equal"]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if kind == "binary":
        rewards = (torch.rand(B, generator=g) < 0.5).double()
    elif kind == "gaussian":
        rewards = torch.randn(B, generator=g, dtype=torch.float64)
    else:
        rewards = torch.full((B,), 0.7, dtype=torch.float64)
    mask = make_mask(B, T, g)
    return rewards, torch.tensor(group_ids), mask, g


@pytest.mark.parametrize("name", OUTCOME)
@SETTINGS
@given(batch=outcome_batch())
def test_outcome_estimator_matches_naive_reference(name, batch):
    rewards, group_ids, mask, g = batch
    ref = REFERENCES.get(("advantage", name))
    if ref is None:
        pytest.fail(f"no naive reference for advantage estimator {name!r}")
    kwargs = extra_kwargs("advantage", name, *mask.shape, g)
    got = ADVANTAGE_ESTIMATORS[name](rewards, group_ids, mask, **kwargs)
    expected = ref(rewards, group_ids, mask, **kwargs)
    assert got.shape == mask.shape
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert torch.isfinite(got).all()
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))


@pytest.mark.parametrize("name", OUTCOME)
def test_all_equal_groups_give_exactly_zero(name):
    # 0.7 and 0.1 are not exact in binary: a sum/n mean would leave ~1e-17 residues, amplified by 1/eps.
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.1, 0.1, 0.1], dtype=torch.float32)
    group_ids = torch.tensor([0, 0, 0, 5, 5, 5])
    mask = torch.ones(6, 3, dtype=torch.bool)
    got = ADVANTAGE_ESTIMATORS[name](rewards, group_ids, mask)
    if name == "reinforce":  # no baseline: the raw rewards, equal or not
        assert torch.equal(got, rewards.unsqueeze(-1).expand(6, 3))
        return
    if name in ("reinforce_pp",):  # batch-only estimator: the batch is not all equal
        assert torch.isfinite(got).all()
    else:
        assert torch.equal(got, torch.zeros(6, 3))
    same = ADVANTAGE_ESTIMATORS[name](torch.full((6,), 0.7), group_ids, mask)
    assert torch.equal(same, torch.zeros(6, 3))


@pytest.mark.parametrize("name", OUTCOME)
def test_singleton_groups_are_finite(name):
    rewards = torch.tensor([1.0, 0.0, 0.5])
    got = ADVANTAGE_ESTIMATORS[name](rewards, torch.tensor([0, 1, 2]), torch.ones(3, 2, dtype=torch.bool))
    assert torch.isfinite(got).all()
    if name in ("grpo", "dr_grpo", "rloo", "lite_ppo", "reinforce_pp_baseline"):
        assert torch.equal(got, torch.zeros(3, 2))  # group mean of a singleton is itself


def test_hand_worked_grpo_lite_ppo_rloo():
    # Group 0 rewards {1, 0}: mean 0.5, unbiased std sqrt(0.5) -> GRPO +-0.5/0.7071 = +-0.7071.
    # Group 1 rewards {1, 1, 1, 0}... use {1, 1, 0}: mean 2/3, unbiased std sqrt(1/3).
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    group_ids = torch.tensor([0, 0, 1, 1, 1])
    mask = torch.ones(5, 1, dtype=torch.bool)
    got = ADVANTAGE_ESTIMATORS["grpo"](rewards, group_ids, mask)[:, 0]
    s1 = math.sqrt(1 / 3)
    expected = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), (1 / 3) / s1, (1 / 3) / s1, (-2 / 3) / s1]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=1e-5)
    # Lite PPO: same numerators, one batch std of {1,0,1,1,0}: mean 0.6, unbiased var 0.3.
    got = ADVANTAGE_ESTIMATORS["lite_ppo"](rewards, group_ids, mask)[:, 0]
    expected = [0.5, -0.5, 1 / 3, 1 / 3, -2 / 3]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64) / (math.sqrt(0.3) + 1e-6))
    # RLOO: r_i - mean of the others. Group 1: 1 - (1+0)/2 = 0.5, 0 - 1 = -1.
    got = ADVANTAGE_ESTIMATORS["rloo"](rewards, group_ids, mask)[:, 0]
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 0.5, 0.5, -1.0], dtype=torch.float64))


def _naive_normalize(rewards, group_ids, mean_scope, std_scope, eps, unbiased):
    r = rewards.tolist()
    ids = group_ids.tolist()

    def members(i, scope):
        return [r[j] for j in range(len(r)) if scope == "batch" or ids[j] == ids[i]]

    out = []
    for i in range(len(r)):
        x = r[i]
        if mean_scope != "none":
            vals = members(i, mean_scope)
            x = 0.0 if len(set(vals)) == 1 else x - sum(vals) / len(vals)
        if std_scope != "none":
            vals = members(i, std_scope)
            dof = len(vals) - 1 if unbiased else len(vals)
            if len(set(vals)) > 1 and dof > 0:
                m = sum(vals) / len(vals)
                x = x / (math.sqrt(sum((v - m) ** 2 for v in vals) / dof) + eps)
        out.append(x)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("mean_scope", ["group", "batch", "none"])
@pytest.mark.parametrize("std_scope", ["group", "batch", "none"])
@pytest.mark.parametrize("unbiased", [True, False])
def test_normalize_rewards_every_scope(mean_scope, std_scope, unbiased):
    g = torch.Generator().manual_seed(0)
    rewards = torch.cat([torch.randn(6, generator=g, dtype=torch.float64), torch.tensor([2.0, 2.0, 5.0])])
    group_ids = torch.tensor([4, 1, 4, 1, 1, 9, 2, 2, 8])  # group 2 all equal, groups 8 and 9 singletons
    got = normalize_rewards(rewards, group_ids, mean_scope=mean_scope, std_scope=std_scope, eps=1e-6, unbiased=unbiased)
    expected = _naive_normalize(rewards, group_ids, mean_scope, std_scope, 1e-6, unbiased)
    torch.testing.assert_close(got, expected)


def test_normalize_rewards_validation():
    r = torch.zeros(4)
    with pytest.raises(ValueError, match=r"group_ids has dtype torch.float32, expected an integer dtype"):
        normalize_rewards(r, torch.zeros(4))
    with pytest.raises(ValueError, match=r"group_ids has shape \[3\], expected \[4\] like rewards"):
        normalize_rewards(r, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"std_scope is 'prompt'"):
        normalize_rewards(r, torch.zeros(4, dtype=torch.long), std_scope="prompt")
    with pytest.raises(ValueError, match=r"rewards has non-finite values"):
        normalize_rewards(torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask has shape \[3, 2\], expected \[4, T\] like rewards"):
        ADVANTAGE_ESTIMATORS["grpo"](r, torch.zeros(4, dtype=torch.long), torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"sample_weights has negative values, expected weights >= 0"):
        normalize_rewards(r, torch.zeros(4, dtype=torch.long), sample_weights=torch.tensor([1.0, -0.5, 1.0, 1.0]))


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 4),
    T=st.integers(1, 9),
    gamma=st.sampled_from([1.0, 0.9]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
)
def test_gae_matches_naive_reference(seed, B, T, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = make_mask(B, T, g, p_on=0.6)  # holes = observation tokens of a multi-turn rollout
    rewards[~mask] = float("nan")  # ignored outside the mask
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = REFERENCES[("advantage", "gae")](rewards, values, mask, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_gae_hand_worked_skips_observation_tokens():
    # Tokens: [resp r=0 V=0.5] [obs] [resp r=1 V=0.2]; gamma = lam = 1.
    # Last response token: A = 1 - 0.2 = 0.8. First: delta = 0 + V_next(0.2) - 0.5 = -0.3; A = -0.3 + 0.8 = 0.5.
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.2]])
    mask = torch.tensor([[True, False, True]])
    adv, ret = gae(rewards, values, mask)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.8]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0]]))


def test_gae_and_turn_returns_validation():
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^token_rewards has shape \[3\], expected 2 dimensions"):
        gae(torch.zeros(3), torch.zeros(3), mask[0])
    # integer rewards would make the advantages integer (0.5 truncated to 0): rejected
    with pytest.raises(ValueError, match=r"^token_rewards has dtype torch.int64, expected a floating dtype"):
        gae(torch.tensor([[0, 0, 1]]), torch.zeros(1, 3), mask)
    with pytest.raises(ValueError, match=r"^turn_rewards has shape \[3\], expected 2 dimensions"):
        turn_returns(torch.zeros(3), mask[0])


@st.composite
def multi_turn_batch(draw):
    B = draw(st.integers(1, 4))
    K = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    turn_mask = torch.rand(B, K, generator=g) < 0.8
    turn_rewards = torch.randn(B, K, generator=g, dtype=torch.float64)
    turn_rewards[~turn_mask] = float("nan")
    # tokens: for each existing turn 1-3 response tokens followed by an observation token (-1)
    rows = []
    for b in range(B):
        row = [-1]
        for k in range(K):
            if turn_mask[b, k]:
                row += [k] * int(torch.randint(1, 4, (), generator=g)) + [-1]
        rows.append(row)
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + [-1] * (T - len(r)) for r in rows])
    return turn_rewards, turn_mask, ids, draw(st.sampled_from([1.0, 0.5])), draw(st.booleans())


@SETTINGS
@given(batch=multi_turn_batch())
def test_rebn_matches_naive_reference(batch):
    turn_rewards, turn_mask, ids, gamma, unbiased = batch
    got = rebn(turn_rewards, turn_mask, ids, gamma=gamma, unbiased=unbiased)
    expected = REFERENCES[("advantage", "rebn")](turn_rewards, turn_mask, ids, gamma=gamma, unbiased=unbiased)
    torch.testing.assert_close(got, expected)
    raw = rebn(turn_rewards, turn_mask, ids, gamma=gamma, normalize=False)
    torch.testing.assert_close(raw, REFERENCES[("advantage", "rebn")](turn_rewards, turn_mask, ids, gamma=gamma, normalize=False))


def test_rebn_hand_worked():
    # Episode 0: turn rewards (0, 1), gamma 0.5 -> G = (0.5, 1). Episode 1: one turn, reward 1 -> G = 1.
    # Pool (0.5, 1, 1): mean 5/6, population std sqrt(1/18) -> A = (-sqrt 2, 1/sqrt 2, 1/sqrt 2),
    # per transition (the 3-token turn counts once).
    turn_rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    turn_mask = torch.tensor([[True, True], [True, False]])
    ids = torch.tensor([[-1, 0, 0, 0, -1, 1], [-1, 0, -1, -1, -1, -1]])
    got = rebn(turn_rewards, turn_mask, ids, gamma=0.5)
    a, b = -math.sqrt(2), 1 / math.sqrt(2)
    expected = torch.tensor([[0, a, a, a, 0, b], [0, b, 0, 0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(got, expected, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(turn_returns(turn_rewards, turn_mask, gamma=0.5), torch.tensor([[0.5, 1.0], [1.0, 0.0]], dtype=torch.float64))


def test_rebn_validation():
    r = torch.zeros(1, 2)
    tm = torch.tensor([[True, False]])
    with pytest.raises(ValueError, match=r"token_turn_ids points at turns where turn_mask is 0"):
        rebn(r, tm, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"token_turn_ids has values outside \[-1, 1\]"):
        rebn(r, tm, torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match=r"token_turn_ids has dtype torch.float32, expected an integer dtype"):
        rebn(r, tm, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"turn_mask has shape \[1, 3\], expected \[1, 2\] like turn_rewards"):
        rebn(r, torch.ones(1, 3, dtype=torch.bool), torch.tensor([[0]]))


def test_advantage_arguments_are_named_when_wrong():
    with pytest.raises(ValueError, match=r"^rewards has dtype torch.int64, expected a floating dtype$"):
        normalize_rewards(torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^mask has shape \[4\], expected 2 dimensions$"):
        ADVANTAGE_ESTIMATORS["lite_ppo"](torch.zeros(4), torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^values has shape \[1, 2\], expected \[1, 3\] like token_rewards$"):
        gae(torch.zeros(1, 3), torch.zeros(1, 2), mask)
    with pytest.raises(ValueError, match=r"^token_rewards has non-finite values \(NaN or Inf\) in masked-in positions$"):
        gae(torch.tensor([[0.0, float("nan"), 1.0]]), torch.zeros(1, 3), mask)
    with pytest.raises(ValueError, match=r"^sample_weights has shape \[3\], expected \[2\] like rewards$"):
        normalize_rewards(torch.zeros(2), torch.zeros(2, dtype=torch.long), sample_weights=torch.ones(3))


def test_gae_works_in_the_rewards_precision():
    # float64 values with float32 rewards: the values are rounded to float32 first, so both outputs are
    # float32 and equal the all-float32 computation
    mask = torch.ones(1, 3, dtype=torch.bool)
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2 + 1e-12, 0.3]], dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    adv32, ret32 = gae(rewards, values.float(), mask, gamma=0.9, lam=0.8)
    assert torch.equal(adv, adv32) and torch.equal(ret, ret32)


def test_lite_ppo_divides_by_the_batch_std_plus_its_eps():
    from credo.algos.advantages import lite_ppo

    # groups {0, 2} and {0, 2}: numerators -1, 1, -1, 1; batch std of {0, 2, 0, 2} (unbiased) sqrt(4/3)
    rewards = torch.tensor([0.0, 2.0, 0.0, 2.0], dtype=torch.float64)
    got = lite_ppo(rewards, torch.tensor([0, 0, 1, 1]), torch.ones(4, 1, dtype=torch.bool), eps=1.0)[:, 0]
    expected = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64) / (math.sqrt(4 / 3) + 1.0)
    torch.testing.assert_close(got, expected)
