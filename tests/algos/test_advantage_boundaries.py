"""The advantage estimators on hand-worked inputs: each default (scopes, eps, unbiased, token weighting, gamma, lam),
zero and fractional sample weights, singleton and all-equal groups, empty batches, the first and last token, and
every error message (anchored, naming the tensor)."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos import advantages as A
from credo.algos.advantages import (
    ADVANTAGE_ESTIMATORS, ADVANTAGE_INPUTS, GROUP_ESTIMATORS, SCOPES, dr_grpo, gae, grpo, lite_ppo, normalize_rewards,
    rebn, register_advantage_estimator, reinforce, reinforce_pp, reinforce_pp_baseline, rloo, turn_returns,
)

F64 = torch.float64


def _t(xs, dtype=F64):
    return torch.tensor(xs, dtype=dtype)


def _col(adv):
    """The advantage of each sequence from a [B, 1] all-True layout."""
    assert adv.shape[1] == 1
    return adv[:, 0]


ONE = torch.ones(5, 1, dtype=torch.bool)
# group 1: rewards 0 and 2 (mean 1, unbiased std sqrt 2, population std 1); group 2: 5 and 5 (all equal);
# group 3: the singleton 1
R = _t([0.0, 2.0, 5.0, 5.0, 1.0])
G = torch.tensor([1, 1, 2, 2, 3])


def test_registry_names_kinds_and_constants():
    assert SCOPES == ("group", "batch", "none")
    assert GROUP_ESTIMATORS == {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "lite_ppo"}
    for name in ("reinforce", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "lite_ppo"):
        assert ADVANTAGE_INPUTS[name] == "outcome", name
    assert ADVANTAGE_INPUTS["gae"] == "token_rewards_values"
    assert ADVANTAGE_INPUTS["rebn"] == "turn_rewards"
    assert ADVANTAGE_ESTIMATORS["grpo"] is grpo and ADVANTAGE_ESTIMATORS["rloo"] is rloo
    assert ADVANTAGE_ESTIMATORS["gae"] is gae and ADVANTAGE_ESTIMATORS["rebn"] is rebn
    assert ADVANTAGE_ESTIMATORS["reinforce_pp"] is reinforce_pp and ADVANTAGE_ESTIMATORS["lite_ppo"] is lite_ppo


def test_register_advantage_estimator_defaults_to_outcome_and_refuses_a_taken_name():
    def mine(rewards, group_ids, mask):
        return rewards

    try:
        assert register_advantage_estimator("test_only_adv")(mine) is mine
        assert ADVANTAGE_ESTIMATORS["test_only_adv"] is mine and ADVANTAGE_INPUTS["test_only_adv"] == "outcome"
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_only_adv", None)
        ADVANTAGE_INPUTS.pop("test_only_adv", None)
    with pytest.raises(ValueError, match=r"^advantage estimator 'grpo' is already registered by credo\.algos\.advantages\.grpo$"):
        register_advantage_estimator("grpo", inputs="turn_rewards")(mine)
    assert ADVANTAGE_INPUTS["grpo"] == "outcome"


def test_normalize_rewards_defaults_are_group_scopes_unbiased_and_eps_1e_6():
    got = normalize_rewards(R, G)
    s = math.sqrt(2) + 1e-6
    torch.testing.assert_close(got, _t([-1 / s, 1 / s, 0.0, 0.0, 0.0]), rtol=1e-14, atol=0)
    assert got.dtype == F64 and got.shape == (5,)
    # population std: 1 -> +-1 / (1 + eps)
    got = normalize_rewards(R, G, unbiased=False, eps=0.0)
    torch.testing.assert_close(got, _t([-1.0, 1.0, 0.0, 0.0, 0.0]), rtol=0, atol=0)


def test_normalize_rewards_batch_and_none_scopes():
    # batch: mean 13/5; unbiased variance sum (r - 2.6)^2 / 4
    m = 13 / 5
    var = sum((x - m) ** 2 for x in R.tolist()) / 4
    got = normalize_rewards(R, G, mean_scope="batch", std_scope="batch", eps=0.5)
    torch.testing.assert_close(got, (R - m) / (math.sqrt(var) + 0.5), rtol=1e-14, atol=0)
    # no shift, no scaling: the rewards themselves, detached
    r = R.clone().requires_grad_()
    got = normalize_rewards(r, G, mean_scope="none", std_scope="none")
    assert torch.equal(got, R) and not got.requires_grad
    # no shift, group scaling: the all-equal group and the singleton are not scaled (divided by 1)
    got = normalize_rewards(R, G, mean_scope="none", std_scope="group", eps=0.0)
    torch.testing.assert_close(got, _t([0.0, 2 / math.sqrt(2), 5.0, 5.0, 1.0]), rtol=1e-14, atol=0)
    # group shift, batch scaling (lite PPO): the group means and the batch std of the raw rewards
    got = normalize_rewards(R, G, mean_scope="group", std_scope="batch", eps=0.0)
    torch.testing.assert_close(got, _t([-1.0, 1.0, 0.0, 0.0, 0.0]) / math.sqrt(var), rtol=1e-14, atol=0)
    # batch shift, group scaling
    got = normalize_rewards(R, G, mean_scope="batch", std_scope="group", eps=0.0)
    want = _t([(0 - m) / math.sqrt(2), (2 - m) / math.sqrt(2), 5 - m, 5 - m, 1 - m])
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    # and the output never carries a gradient
    assert not normalize_rewards(R.clone().requires_grad_(), G).requires_grad


def test_normalize_rewards_of_an_all_equal_batch_is_exactly_zero():
    r = _t([0.3, 0.3, 0.3])
    for ms in ("group", "batch"):
        for ss in SCOPES:
            got = normalize_rewards(r, torch.tensor([0, 0, 1]), mean_scope=ms, std_scope=ss)
            assert torch.equal(got, torch.zeros(3, dtype=F64)), (ms, ss)


def test_normalize_rewards_of_an_empty_batch_is_empty():
    for ms in SCOPES:
        for ss in SCOPES:
            got = normalize_rewards(torch.zeros(0), torch.zeros(0, dtype=torch.long), mean_scope=ms, std_scope=ss)
            assert got.shape == (0,)
    assert rloo(torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.bool)).shape == (0, 3)


def test_a_single_reward_is_degenerate_in_every_scope():
    r = _t([4.0])
    assert normalize_rewards(r, torch.tensor([9])).tolist() == [0.0]
    assert normalize_rewards(r, torch.tensor([9]), mean_scope="none").tolist() == [4.0]  # not divided: no std
    assert normalize_rewards(r, torch.tensor([9]), mean_scope="none", unbiased=False).tolist() == [4.0]


def test_zero_weights_leave_samples_out_of_the_statistics_only():
    # weights (1, 1, 0): mean of (0, 2) = 1, population std 1; the weight-0 sample is still normalised
    got = normalize_rewards(_t([0.0, 2.0, 100.0]), torch.zeros(3, dtype=torch.long), unbiased=False, eps=0.0,
                            sample_weights=torch.tensor([1, 1, 0]))  # integer weights are accepted
    torch.testing.assert_close(got, _t([-1.0, 1.0, 99.0]), rtol=0, atol=0)
    # only the weight-0 sample differs: the live ones are equal, so the group is degenerate (0, no scaling)
    got = normalize_rewards(_t([2.0, 2.0, 100.0]), torch.zeros(3, dtype=torch.long),
                            sample_weights=_t([1.0, 3.0, 0.0]))
    assert got.tolist() == [0.0, 0.0, 0.0]
    got = normalize_rewards(_t([2.0, 2.0, 100.0]), torch.zeros(3, dtype=torch.long), mean_scope="none",
                            sample_weights=_t([1.0, 3.0, 0.0]))
    assert got.tolist() == [2.0, 2.0, 100.0]
    # a group whose every weight is 0: mean 0 and no scaling, so its advantages are 0
    got = normalize_rewards(_t([1.0, 3.0, 5.0, 9.0]), torch.tensor([0, 0, 1, 1]), sample_weights=_t([0, 0, 1, 1]),
                            eps=0.0)
    torch.testing.assert_close(got, _t([0.0, 0.0, -2 / math.sqrt(8), 2 / math.sqrt(8)]), rtol=1e-14, atol=0)


def test_weights_are_frequencies_for_the_mean_and_the_unbiased_std():
    # weights (1, 3) on (0, 4): mean 3, unbiased variance (1*9 + 3*1) / (4 - 1) = 4, std 2
    got = normalize_rewards(_t([0.0, 4.0]), torch.zeros(2, dtype=torch.long), sample_weights=_t([1.0, 3.0]), eps=0.0)
    torch.testing.assert_close(got, _t([-1.5, 0.5]), rtol=1e-14, atol=0)
    # total weight 1 with unbiased: no degrees of freedom -> degenerate: 0
    got = normalize_rewards(_t([0.0, 4.0]), torch.zeros(2, dtype=torch.long), sample_weights=_t([0.5, 0.5]))
    assert got.tolist() == [0.0, 0.0]
    # total weight 2 with unbiased: dof 1 -> variance 8 / 1
    got = normalize_rewards(_t([0.0, 4.0]), torch.zeros(2, dtype=torch.long), sample_weights=_t([1.0, 1.0]), eps=0.0)
    torch.testing.assert_close(got, _t([-2 / math.sqrt(8), 2 / math.sqrt(8)]), rtol=1e-14, atol=0)


def test_normalize_rewards_names_every_bad_argument():
    r, g = torch.zeros(3), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^rewards has shape \[3, 1\], expected 1 dimensions$"):
        normalize_rewards(torch.zeros(3, 1), g)
    with pytest.raises(ValueError, match=r"^rewards must be a torch\.Tensor, got list$"):
        normalize_rewards([0.0, 1.0], g)
    with pytest.raises(ValueError, match=r"^group_ids has shape \[3, 1\], expected 1 dimensions$"):
        normalize_rewards(r, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^group_ids has dtype torch\.bool, expected an integer dtype$"):
        normalize_rewards(r, torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^group_ids has dtype torch\.float64, expected an integer dtype$"):
        normalize_rewards(r, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match=r"^group_ids has dtype torch\.complex64, expected an integer dtype$"):
        normalize_rewards(r, torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^group_ids has shape \[2\], expected \[3\] like rewards$"):
        normalize_rewards(r, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^mean_scope is 'prompt', expected one of \['group', 'batch', 'none'\]$"):
        normalize_rewards(r, g, mean_scope="prompt")
    with pytest.raises(ValueError, match=r"^std_scope is 'all', expected one of \['group', 'batch', 'none'\]$"):
        normalize_rewards(r, g, std_scope="all")
    with pytest.raises(ValueError, match=r"^rewards has non-finite values \(NaN or Inf\)$"):
        normalize_rewards(torch.tensor([0.0, float("inf"), 1.0]), g)
    with pytest.raises(ValueError, match=r"^sample_weights has non-finite values \(NaN or Inf\)$"):
        normalize_rewards(r, g, sample_weights=torch.tensor([1.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match=r"^sample_weights has negative values, expected weights >= 0$"):
        normalize_rewards(r, g, sample_weights=torch.tensor([1, -1, 1]))
    with pytest.raises(ValueError, match=r"^sample_weights must be a torch\.Tensor, got list$"):
        normalize_rewards(r, g, sample_weights=[1.0, 1.0, 1.0])
    # other integer group ids are fine
    for dtype in (torch.int32, torch.int8, torch.uint8, torch.int16):
        for scope in SCOPES:
            got = normalize_rewards(_t([0.0, 2.0]), torch.tensor([3, 3], dtype=dtype), mean_scope=scope, std_scope=scope,
                                    eps=0.0)
            want = {"group": [-1 / math.sqrt(2), 1 / math.sqrt(2)], "batch": [-1 / math.sqrt(2), 1 / math.sqrt(2)],
                    "none": [0.0, 2.0]}[scope]
            torch.testing.assert_close(got, _t(want), rtol=1e-14, atol=0)


def test_outcome_estimators_broadcast_to_the_mask_and_name_a_bad_one():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # a 0/1 float mask; the first and the last token
    r, g = _t([3.0, -1.0]), torch.tensor([0, 1])
    got = reinforce(r, g, mask)
    assert got.dtype == F64 and got.tolist() == [[3.0, 3.0, 0.0], [0.0, 0.0, -1.0]]
    for name in ("reinforce", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "lite_ppo"):
        fn = ADVANTAGE_ESTIMATORS[name]
        with pytest.raises(ValueError, match=r"^mask has shape \[3\], expected 2 dimensions$"):
            fn(_t([0.0, 1.0, 2.0]), torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool))
        # token-weighted REINFORCE++ counts the mask's tokens first: the mask, not its counts, is named
        kws = [{}, {"token_weighted": False}] if name.startswith("reinforce_pp") else [{}]
        for kw in kws:
            with pytest.raises(ValueError, match=r"^mask has shape \[2, 4\], expected \[3, T\] like rewards$"):
                fn(_t([0.0, 1.0, 2.0]), torch.zeros(3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), **kw)
        with pytest.raises(ValueError, match=r"^mask has dtype torch\.int64, expected bool or floating"):
            fn(_t([0.0, 1.0, 2.0]), torch.zeros(3, dtype=torch.long), torch.ones(3, 2, dtype=torch.long))
        with pytest.raises(ValueError, match=r"^rewards has dtype torch\.int64, expected a floating dtype$"):
            fn(torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long), torch.ones(3, 2, dtype=torch.bool))


def test_grpo_defaults_and_options():
    s = math.sqrt(2)
    torch.testing.assert_close(_col(grpo(R, G, ONE)), _t([-1 / (s + 1e-6), 1 / (s + 1e-6), 0, 0, 0]), rtol=1e-14, atol=0)
    torch.testing.assert_close(_col(grpo(R, G, ONE, eps=1.0)), _t([-1 / (s + 1), 1 / (s + 1), 0, 0, 0]), rtol=1e-14, atol=0)
    assert _col(grpo(R, G, ONE, norm_std=False)).tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0]
    assert _col(dr_grpo(R, G, ONE)).tolist() == [-1.0, 1.0, 0.0, 0.0, 0.0]


def test_rloo_is_the_leave_one_out_baseline():
    # group a: (0, 1, 2): 0 - 1.5, 1 - 1, 2 - 0.5; group b: (1, 3): -2, 2; group c: singleton 7 -> 0
    r = _t([0.0, 1.0, 1.0, 2.0, 7.0, 3.0])
    g = torch.tensor([5, 5, -1, 5, 0, -1])
    assert _col(rloo(r, g, torch.ones(6, 1, dtype=torch.bool))).tolist() == [-1.5, 0.0, -2.0, 1.5, 0.0, 2.0]
    got = rloo(r, g, torch.tensor([[True, False]] * 6))
    assert got[:, 1].tolist() == [0.0] * 6 and got.dtype == F64


def test_reinforce_pp_whitens_over_tokens_by_default_with_eps_1e_8():
    # rewards (0, 1) on 1 and 3 masked tokens: weighted mean 3/4, weighted unbiased variance
    # (1 * 0.75^2 + 3 * 0.25^2) / (4 - 1) = 0.25, std 0.5
    mask = torch.tensor([[False, True, False, False], [True, True, False, True]])
    got = reinforce_pp(_t([0.0, 1.0]), torch.tensor([0, 1]), mask)
    want = _t([-0.75, 0.25]) / (0.5 + 1e-8)
    torch.testing.assert_close(got[:, 1], want, rtol=1e-15, atol=0)
    assert got[0].tolist()[::2] == [0.0, 0.0] and got[1, 0] == got[1, 3] and got[1, 2].item() == 0.0
    # per sequence: mean 1/2, unbiased std sqrt(1/2)
    got = reinforce_pp(_t([0.0, 1.0]), torch.tensor([0, 1]), mask, token_weighted=False, eps=0.0)
    torch.testing.assert_close(got[:, 1], _t([-0.5, 0.5]) / math.sqrt(0.5), rtol=1e-14, atol=0)
    got = reinforce_pp(_t([0.0, 1.0]), torch.tensor([0, 1]), mask, eps=0.5)
    torch.testing.assert_close(got[:, 1], _t([-0.75, 0.25]), rtol=1e-14, atol=0)
    # group ids play no part
    assert torch.equal(reinforce_pp(_t([0.0, 1.0]), torch.tensor([7, 7]), mask), reinforce_pp(_t([0.0, 1.0]),
                       torch.tensor([0, 1]), mask))


def test_reinforce_pp_baseline_centres_in_the_group_then_whitens_over_tokens():
    # groups (0, 2) and (4, 4): centred (-1, 1, 0, 0); token weights (1, 1, 2, 0): weighted mean 0, weighted
    # unbiased variance (1 + 1 + 0) / (4 - 1) = 2/3
    r, g = _t([0.0, 2.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[True, False], [False, True], [True, True], [False, False]])
    got = reinforce_pp_baseline(r, g, mask)
    s = math.sqrt(2 / 3) + 1e-8
    torch.testing.assert_close(got, _t([[-1 / s, 0], [0, 1 / s], [0, 0], [0, 0]]), rtol=1e-14, atol=0)
    # per sequence: centred (-1, 1, 0, 0), mean 0, unbiased variance 2/3 as well: the same here...
    got_seq = reinforce_pp_baseline(r, g, mask, token_weighted=False, eps=1.0)
    s1 = math.sqrt(2 / 3) + 1.0
    torch.testing.assert_close(got_seq, _t([[-1 / s1, 0], [0, 1 / s1], [0, 0], [0, 0]]), rtol=1e-14, atol=0)
    # ...but not with unequal lengths: weights (1, 3, 0, 0) -> mean 1/2, variance (2.25 + 3 * 0.25) / 3 = 1
    mask = torch.tensor([[True, False, False], [True, True, True], [False, False, False], [False, False, False]])
    got = reinforce_pp_baseline(r, g, mask, eps=0.0)
    torch.testing.assert_close(got[:2, 0], _t([-1.5, 0.5]), rtol=1e-14, atol=0)
    assert got[2:].abs().sum().item() == 0.0


def test_lite_ppo_default_eps_is_1e_6():
    m = 13 / 5
    std = math.sqrt(sum((x - m) ** 2 for x in R.tolist()) / 4)
    got = _col(lite_ppo(R, G, ONE))
    torch.testing.assert_close(got, _t([-1.0, 1.0, 0.0, 0.0, 0.0]) / (std + 1e-6), rtol=1e-14, atol=0)


# --------------------------------------------------------------------------------------------- gae


def test_gae_defaults_are_gamma_and_lambda_one():
    # undiscounted: A_t = sum of later rewards + 0 - V_t; returns = sum of later rewards
    r = _t([[1.0, 0.0, 2.0]])
    v = _t([[0.5, 0.25, 4.0]])
    adv, ret = gae(r, v, torch.ones(1, 3, dtype=torch.bool))
    assert adv.tolist() == [[2.5, 1.75, -2.0]] and ret.tolist() == [[3.0, 2.0, 2.0]]


def test_gae_hand_worked_with_gamma_and_lambda():
    # gamma 0.5, lam 0.5: last token delta = 2 - 4 = -2 = A_2; token 1: delta = 0 + 0.5 * 4 - 0.25 = 1.75,
    # A_1 = 1.75 + 0.25 * (-2) = 1.25; token 0: delta = 1 + 0.5 * 0.25 - 0.5 = 0.625, A_0 = 0.625 + 0.25 * 1.25
    r = _t([[1.0, 0.0, 2.0]])
    v = _t([[0.5, 0.25, 4.0]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.5, lam=0.5)  # a 0/1 float mask
    assert adv.tolist() == [[0.9375, 1.25, -2.0]]
    assert ret.tolist() == [[1.4375, 1.5, 2.0]]
    # lam only: gamma 1, lam 0 -> one-step TD errors
    adv, _ = gae(r, v, torch.ones(1, 3, dtype=torch.bool), lam=0.0)
    assert adv.tolist() == [[0.75, 3.75, -2.0]]
    # gamma only: gamma 0, lam 1 -> r - V
    adv, _ = gae(r, v, torch.ones(1, 3, dtype=torch.bool), gamma=0.0)
    assert adv.tolist() == [[0.5, -0.25, -2.0]]


def test_gae_first_and_last_tokens_and_detached_outputs():
    r = _t([[9.0, 1.0, 0.0, 9.0]]).requires_grad_()
    v = _t([[9.0, 0.5, 0.25, 9.0]]).requires_grad_()
    mask = torch.tensor([[False, True, True, False]])
    adv, ret = gae(r, v, mask, gamma=0.5, lam=0.5)
    # token 2 is the last: A = 0 - 0.25; token 1: delta = 1 + 0.5 * 0.25 - 0.5 = 0.625, A = 0.625 + 0.25 * -0.25
    assert adv.tolist() == [[0.0, 0.5625, -0.25, 0.0]] and ret.tolist() == [[0.0, 1.0625, 0.0, 0.0]]
    assert not adv.requires_grad and not ret.requires_grad
    assert adv.shape == (1, 4) and adv.dtype == F64


def test_gae_names_every_bad_argument():
    m = torch.ones(1, 2, dtype=torch.bool)
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"^token_rewards must be a torch\.Tensor, got list$"):
        gae([[0.0, 0.0]], z, m)
    with pytest.raises(ValueError, match=r"^values has dtype torch\.int64, expected a floating dtype$"):
        gae(z, torch.zeros(1, 2, dtype=torch.long), m)
    with pytest.raises(ValueError, match=r"^mask has shape \[2\], expected \[1, 2\] like token_rewards$"):
        gae(z, z, m[0])
    with pytest.raises(ValueError, match=r"^values has non-finite values \(NaN or Inf\) in masked-in positions$"):
        gae(z, torch.tensor([[0.0, float("inf")]]), m)
    # non-finite values outside the mask are ignored
    adv, ret = gae(torch.tensor([[1.0, float("nan")]]), torch.tensor([[0.0, float("inf")]]),
                   torch.tensor([[True, False]]))
    assert adv.tolist() == [[1.0, 0.0]] and ret.tolist() == [[1.0, 0.0]]


# --------------------------------------------------------------------------------------------- turns


def test_turn_returns_default_gamma_one_and_a_skipped_turn():
    r = _t([[1.0, 50.0, 2.0, 4.0], [3.0, 0.0, 0.0, 0.0]])
    tm = torch.tensor([[True, False, True, True], [True, False, False, False]])
    assert turn_returns(r, tm).tolist() == [[7.0, 0.0, 6.0, 4.0], [3.0, 0.0, 0.0, 0.0]]
    # gamma 0.5: G3 = 4, G2 = 2 + 2 = 4, G0 = 1 + 0.5 * 4 = 3 (the missing turn carries the return)
    got = turn_returns(r, tm.double(), gamma=0.5)
    assert got.tolist() == [[3.0, 0.0, 4.0, 4.0], [3.0, 0.0, 0.0, 0.0]]
    assert got.dtype == F64 and not turn_returns(r.clone().requires_grad_(), tm).requires_grad
    with pytest.raises(ValueError, match=r"^turn_mask has dtype torch\.int64, expected bool or floating"):
        turn_returns(r, tm.long())
    with pytest.raises(ValueError, match=r"^turn_rewards has dtype torch\.int64, expected a floating dtype$"):
        turn_returns(r.long(), tm)
    with pytest.raises(ValueError, match=r"^turn_rewards has non-finite values \(NaN or Inf\) in masked-in positions$"):
        turn_returns(_t([[float("nan"), 1.0]]), torch.tensor([[True, True]]))
    r[0, 1] = float("nan")  # ignored on a missing turn
    assert turn_returns(r, tm)[0].tolist() == [7.0, 0.0, 6.0, 4.0]


def test_rebn_defaults_are_population_std_and_eps_1e_9():
    # returns (undiscounted by default) 3, 2 and 1 -> mean 2, population std sqrt(2/3)
    tr = _t([[1.0, 2.0], [1.0, 0.0]])
    tm = torch.tensor([[True, True], [True, False]])
    ids = torch.tensor([[0, 0, -1, 1], [-1, 0, -1, -1]])
    got = rebn(tr, tm, ids)
    s = math.sqrt(2 / 3) + 1e-9
    torch.testing.assert_close(got, _t([[1 / s, 1 / s, 0, 0], [0, -1 / s, 0, 0]]), rtol=1e-14, atol=0)
    # unbiased: std 1
    got = rebn(tr, tm, ids, unbiased=True, eps=0.0)
    assert got.tolist() == [[1.0, 1.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0]]
    # not normalised: the raw returns, discounted by gamma
    got = rebn(tr, tm, ids, normalize=False, gamma=0.5)
    assert got.tolist() == [[2.0, 2.0, 0.0, 2.0], [0.0, 1.0, 0.0, 0.0]]
    got = rebn(tr, tm, ids, normalize=False)
    assert got.tolist() == [[3.0, 3.0, 0.0, 2.0], [0.0, 1.0, 0.0, 0.0]]
    # all returns equal: exactly 0
    assert rebn(_t([[1.0], [1.0]]), torch.ones(2, 1, dtype=torch.bool), torch.tensor([[0, -1], [-1, 0]])).tolist() == [
        [0.0, 0.0], [0.0, 0.0]]


def test_rebn_names_every_bad_layout():
    tr = torch.zeros(2, 2)
    tm = torch.tensor([[True, True], [True, False]])
    with pytest.raises(ValueError, match=r"^token_turn_ids has shape \[3\], expected 2 dimensions$"):
        rebn(tr, tm, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token_turn_ids has dtype torch\.bool, expected an integer dtype$"):
        rebn(tr, tm, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^token_turn_ids has dtype torch\.float64, expected an integer dtype$"):
        rebn(tr, tm, torch.zeros(2, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"^token_turn_ids has values outside \[-1, 1\] \(K = 2 turns in turn_rewards\)$"):
        rebn(tr, tm, torch.tensor([[0, -2], [0, 0]]))
    with pytest.raises(ValueError, match=r"^token_turn_ids has values outside \[-1, 1\] \(K = 2 turns in turn_rewards\)$"):
        rebn(tr, tm, torch.tensor([[2, 0], [0, 0]]))
    with pytest.raises(ValueError, match=r"^token_turn_ids points at turns where turn_mask is 0$"):
        rebn(tr, tm, torch.tensor([[1, 0], [-1, 1]]))
    with pytest.raises(ValueError, match=r"^turn_mask has dtype torch\.int64, expected bool or floating"):
        rebn(tr, tm.long(), torch.zeros(2, 1, dtype=torch.long))
    # -1 and K - 1 are in range; int32 ids are fine; a 0/1 float turn mask too
    got = rebn(_t([[1.0, 3.0], [2.0, 0.0]]), tm.double(), torch.tensor([[-1, 1], [0, -1]], dtype=torch.int32),
               normalize=False)
    assert got.tolist() == [[0.0, 3.0], [2.0, 0.0]]


def test_segment_stats_hand_worked():
    # segment 0: x (1, 3) weights (1, 1); segment 1: x 5 weight 2; segment 2: no member
    x, seg, w = _t([1.0, 5.0, 3.0]), torch.tensor([0, 1, 0]), _t([1.0, 2.0, 1.0])
    mean, std, deg = A._segment_stats(x, seg, 3, w, True)
    assert mean.tolist() == [2.0, 5.0, 0.0]
    torch.testing.assert_close(std, _t([math.sqrt(2), 0.0, 0.0]), rtol=1e-15, atol=0)
    assert deg.tolist() == [False, True, True]
    mean, std, deg = A._segment_stats(x, seg, 3, w, False)
    assert mean.tolist() == [2.0, 5.0, 0.0] and std.tolist() == [1.0, 0.0, 0.0] and deg.tolist() == [False, True, True]


def test_gae_and_turn_returns_accumulate_in_the_rewards_precision():
    # bfloat16 holds 8 significant bits: 256 + 1 = 257 rounds (to even) to 256. Each step of the recursion is
    # formed in the rewards' dtype, so the return of the first turn is 256 + 1 -> 256, then 256 + 1 -> 256 again
    # (a float32 accumulator would carry 257 and give 258).
    r = torch.tensor([[1.0, 1.0, 256.0]], dtype=torch.bfloat16)
    got = turn_returns(r, torch.ones(1, 3, dtype=torch.bool))
    assert got.dtype == torch.bfloat16 and got.float().tolist() == [[256.0, 256.0, 256.0]]
    adv, ret = gae(r, torch.zeros(1, 3, dtype=torch.bfloat16), torch.ones(1, 3, dtype=torch.bool))
    assert adv.dtype == torch.bfloat16 and adv.float().tolist() == [[256.0, 256.0, 256.0]]
    assert ret.float().tolist() == [[256.0, 256.0, 256.0]]
