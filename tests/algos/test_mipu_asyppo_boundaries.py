"""MIPU and AsyPPO helpers on boundary inputs: defaults, every named error, masked-out values,
values exactly at a threshold. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos.asyppo import asyppo_masks, asyppo_value_mean, critic_shards
from credo.algos.mipu import mipu, mipu_accept, mipu_t_post, mipu_threshold, mipu_weights

F64 = torch.float64


def _t(rows, dtype=F64):
    return torch.tensor(rows, dtype=dtype)


# ---- mipu_weights ---------------------------------------------------------------------------------------


def test_weights_default_to_token_level_capped_at_two():
    # log(pi_old / mu) = [log 3, log 1.5, log 0.25]: token weights [2, 1.5, 0.25] with the default cap 2
    # (sequence level would be the geometric mean (3 * 1.5 * 0.25)^(1/3) on every token)
    old = torch.zeros(1, 3, dtype=F64)
    mu = -torch.log(_t([[3.0, 1.5, 0.25]]))
    w = mipu_weights(old, mu, torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(w, _t([[2.0, 1.5, 0.25]]))
    w = mipu_weights(old, mu, torch.ones(1, 3, dtype=torch.bool), w_max=2.5)
    torch.testing.assert_close(w, _t([[2.5, 1.5, 0.25]]))


def test_sequence_weights_average_over_each_rows_masked_tokens():
    # row 0: log-ratios [log 4, 0] on 2 masked tokens (third masked out, huge there): sqrt(4) = 2 -> cap 3 keeps 2
    # row 1: one masked token of log-ratio log 0.5 -> 0.5; row 2: no masked token -> 0
    old = _t([[math.log(4.0), 0.0, 50.0], [math.log(0.5), 9.0, 9.0], [1.0, 1.0, 1.0]])
    mu = torch.zeros(3, 3, dtype=F64)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    w = mipu_weights(old, mu, mask, w_max=3.0, sequence_level=True)
    torch.testing.assert_close(w, _t([[2.0, 2.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert not w.requires_grad


def test_weights_clamp_the_log_ratio_and_ignore_masked_out_nan():
    old = _t([[-30.0, 0.0]])
    mu = _t([[0.0, float("nan")]])
    w = mipu_weights(old, mu, torch.tensor([[True, False]]))
    assert w.tolist() == [[math.exp(-20.0), 0.0]]


def test_weights_name_their_bad_arguments():
    ok = torch.zeros(2, 3, dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^old_log_probs has shape \[3\], expected 2 dimensions$"):
        mipu_weights(torch.zeros(3, dtype=F64), torch.zeros(3, dtype=F64), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^rollout_log_probs has shape \[2, 2\], expected \[2, 3\] like old_log_probs$"):
        mipu_weights(ok, torch.zeros(2, 2, dtype=F64), mask)
    with pytest.raises(ValueError, match=r"^mask has shape \[2, 2\], expected \[2, 3\] like old_log_probs$"):
        mipu_weights(ok, ok, torch.ones(2, 2, dtype=torch.bool))
    bad = ok.clone()
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"^old_log_probs has non-finite values"):
        mipu_weights(bad, ok, mask)
    with pytest.raises(ValueError, match=r"^rollout_log_probs has non-finite values"):
        mipu_weights(ok, bad, mask)
    with pytest.raises(ValueError, match=r"^w_max is 0.5, expected a number >= 1 \(the truncation of pi_old / mu\)$"):
        mipu_weights(ok, ok, mask, w_max=0.5)
    mipu_weights(ok, ok, mask, w_max=1)  # exactly 1 is allowed (an int too)


# ---- mipu (Step 1) --------------------------------------------------------------------------------------


def test_mipu_hand_worked_with_its_defaults():
    # r = 1 everywhere (lp = old), so the dual-clip PPO token loss is -A; A = [1, -1, 2]
    # w = min(pi_old / mu, 2): mu gives ratios [2 (exactly the cap), 4 (capped), 0.5]
    lp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    mu = -torch.log(_t([[2.0, 4.0, 0.5]]))
    adv = _t([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, metrics = mipu(lp, old, adv, mask, rollout_log_probs=mu, agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(2 * -1.0 + 2 * 1.0 + 0.5 * -2.0)
    assert metrics["mipu_w_mean"].item() == pytest.approx(4.5 / 3)
    # w >= w_max counts a weight exactly at the cap: 2 of 3
    assert metrics["mipu_w_capped_frac"].item() == pytest.approx(2 / 3)
    assert metrics["mipu_w_capped_frac"].dtype == metrics["mipu_w_mean"].dtype == F64  # metrics in the inputs' dtype
    assert metrics["dual_clipfrac"].item() == 0.0


def test_mipu_default_clips_and_dual_clip():
    # r = e^1 = 2.72, A = -1: PPO loss max(2.72, 0.8) = 2.72 > dual bound 3? no: kept, 2.72
    # r = e^2 = 7.39, A = -1: dual clip at 3 (default c = 3)
    # r = e^1, A = +1: clipped at 1 + 0.2 -> -1.2;  r = e^-1, A = -1: max(0.37, 0.8) = 0.8
    lp = _t([[1.0, 2.0, 1.0, -1.0]])
    old = torch.zeros(1, 4, dtype=F64)
    adv = _t([[-1.0, -1.0, 1.0, -1.0]])
    loss, metrics = mipu(lp, old, adv, torch.ones(1, 4, dtype=torch.bool), agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(math.e + 3.0 - 1.2 + 0.8, rel=1e-12)
    assert metrics["dual_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["clipfrac_high"].item() == pytest.approx(0.25)
    assert metrics["clipfrac_low"].item() == pytest.approx(0.25)
    # the clip keywords reach the kernel
    loss, _ = mipu(lp, old, adv, torch.ones(1, 4, dtype=torch.bool), agg_mode="seq-mean-token-sum",
                   clip_low=0.5, clip_high=0.5, dual_clip=None)
    assert loss.item() == pytest.approx(math.e + math.exp(2.0) - 1.5 + 0.5, rel=1e-12)


def test_mipu_sequence_level_keyword_reaches_the_weights():
    lp = torch.zeros(1, 2, dtype=F64)
    mu = -torch.log(_t([[4.0, 0.25]]))  # token weights [2, 0.25]; geometric mean 1
    adv = _t([[1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    tok, m_tok = mipu(lp, lp, adv, mask, rollout_log_probs=mu)
    seq, m_seq = mipu(lp, lp, adv, mask, rollout_log_probs=mu, sequence_level=True)
    assert tok.item() == pytest.approx(-(2.0 + 0.25) / 2)
    assert seq.item() == pytest.approx(-1.0)
    assert m_seq["mipu_w_mean"].item() == pytest.approx(1.0)
    assert m_seq["mipu_w_capped_frac"].item() == 0.0
    assert m_tok["mipu_w_capped_frac"].item() == pytest.approx(0.5)


def test_mipu_without_sampler_has_unit_weights_on_masked_tokens():
    lp = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[True, False], [False, False]])
    _, metrics = mipu(lp, lp, torch.ones(2, 2, dtype=F64), mask)
    assert metrics["mipu_w_mean"].item() == 1.0
    capped = metrics["mipu_w_capped_frac"]
    assert capped.item() == 0.0 and capped.dtype == F64 and capped.shape == ()


# ---- mipu_t_post ----------------------------------------------------------------------------------------


def test_t_post_averages_each_row_over_its_own_tokens():
    # B = 2, T = 3 (not square): row 0 has 3 tokens of log-ratio 0.3 -> rho e^0.3; row 1 has one of -0.6
    # A = [1, 1]: T_post = -(e^0.3 + e^-0.6) / 2
    lp = _t([[0.3, 0.3, 0.3], [-0.6, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    out = mipu_t_post(lp, torch.zeros(2, 3, dtype=F64), torch.ones(2, dtype=F64), mask)
    assert out == pytest.approx(-(math.exp(0.3) + math.exp(-0.6)) / 2, rel=1e-12)
    assert isinstance(out, float)


def test_t_post_checks_only_masked_in_values_and_names_each_tensor():
    lp = _t([[0.0, float("nan")]])
    mask = torch.tensor([[True, False]])
    adv = _t([2.0])
    assert mipu_t_post(lp, lp, adv, mask) == -2.0  # NaN outside the mask is ignored in both tensors
    with pytest.raises(ValueError, match=r"^log_probs_new has non-finite values"):
        mipu_t_post(lp, torch.zeros(1, 2, dtype=F64), adv, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^sampler_log_probs_new has non-finite values"):
        mipu_t_post(torch.zeros(1, 2, dtype=F64), lp, adv, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"^sampler_log_probs_new has shape \[1, 3\], expected \[1, 2\] like log_probs_new$"
    ):
        mipu_t_post(lp, torch.zeros(1, 3, dtype=F64), adv, mask)
    with pytest.raises(
        ValueError, match=r"^advantages has shape \[2\], expected \[1\] \(one per row of log_probs_new \[1, 2\]\)$"
    ):
        mipu_t_post(lp, lp, torch.ones(2, dtype=F64), mask)
    with pytest.raises(ValueError, match=r"^advantages has shape \[1, 1\], expected 1 dimensions$"):
        mipu_t_post(lp, lp, torch.ones(1, 1, dtype=F64), mask)
    with pytest.raises(ValueError, match=r"^advantages has dtype torch.int64, expected a floating dtype$"):
        mipu_t_post(lp, lp, torch.ones(1, dtype=torch.long), mask)
    with pytest.raises(ValueError, match=r"^log_probs_new has dtype torch.int64, expected a floating dtype$"):
        mipu_t_post(torch.zeros(1, 2, dtype=torch.long), lp, adv, mask)
    with pytest.raises(ValueError, match=r"^mask has shape \[2, 2\], expected \[1, 2\] like log_probs_new$"):
        mipu_t_post(lp, lp, adv, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"^mask has no masked-in token: T_post needs at least one validation response$"
    ):
        mipu_t_post(lp, lp, adv, torch.zeros(1, 2, dtype=torch.bool))


# ---- mipu_threshold / mipu_accept -----------------------------------------------------------------------


def test_threshold_names_each_bad_argument():
    for args, kwargs, msg in [
        ((-1, 0.0, 0.0), {}, r"^step is -1, expected an integer >= 0$"),
        ((True, 0.0, 0.0), {}, r"^step is True, expected an integer >= 0$"),
        ((1.0, 0.0, 0.0), {}, r"^step is 1.0, expected an integer >= 0$"),
        ((1, 0.0, 0.0), {"anneal_steps": -3}, r"^anneal_steps is -3, expected an integer >= 0$"),
        ((1, float("inf"), 0.0), {}, r"^c_start is inf, expected a finite number$"),
        ((1, "1", 0.0), {}, r"^c_start is '1', expected a finite number$"),
        ((1, 0.0, False), {}, r"^c_end is False, expected a finite number$"),
        ((1, 0.0, float("-inf")), {}, r"^c_end is -inf, expected a finite number$"),
    ]:
        with pytest.raises(ValueError, match=msg):
            mipu_threshold(*args, **kwargs)


def test_threshold_at_step_zero_with_no_anneal_and_ints():
    assert mipu_threshold(0, 4, 1, anneal_steps=4) == 4
    assert mipu_threshold(1, 4, 1, anneal_steps=4) == 3.25  # 4 + (1 - 4) * 1 / 4
    assert mipu_threshold(3, 4, 1, anneal_steps=4) == 1.75
    out = mipu_threshold(4, 4, 1, anneal_steps=4)
    assert out == 1.0 and isinstance(out, float)
    assert mipu_threshold(0, 4.0, 2.0, anneal_steps=0) == 2.0
    assert mipu_threshold(99, 1.0, 0.0) == pytest.approx(0.01)  # default anneal_steps = 100


def test_accept_names_each_bad_argument_and_the_boundary():
    with pytest.raises(ValueError, match=r"^c_k is nan, expected a number \(not NaN\)$"):
        mipu_accept(0.0, float("nan"))
    with pytest.raises(ValueError, match=r"^t_post is nan, expected a number \(not NaN\)$"):
        mipu_accept(float("nan"), 0.0)
    with pytest.raises(ValueError, match=r"^t_post is True, expected a number"):
        mipu_accept(True, 0.0)
    with pytest.raises(ValueError, match=r"^c_k is '0', expected a number"):
        mipu_accept(0.0, "0")
    assert mipu_accept(-0.5, 0.5) is True  # t_post == -c_k exactly
    assert mipu_accept(-0.5, 0.25) is False
    assert mipu_accept(0.25, -0.25) is True  # == -c_k = 0.25
    assert mipu_accept(float("inf"), 0) is True


# ---- asyppo ---------------------------------------------------------------------------------------------


def test_value_mean_names_bad_values():
    with pytest.raises(ValueError, match=r"^values has dtype torch.int64, expected a floating dtype$"):
        asyppo_value_mean(torch.ones(2, 1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^values has shape \[2, 3\], expected 3 dimensions$"):
        asyppo_value_mean(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"^values has shape \[0, 2, 3\], expected \[M, B, T\] with M >= 1 critics$"):
        asyppo_value_mean(torch.ones(0, 2, 3))
    # one critic is its own mean; an empty batch is fine
    torch.testing.assert_close(asyppo_value_mean(_t([[[1.0, 2.0]]])), _t([[1.0, 2.0]]))
    assert asyppo_value_mean(torch.ones(2, 0, 3)).shape == (0, 3)
    torch.testing.assert_close(asyppo_value_mean(_t([[[1.0, 2.0]], [[3.0, 6.0]]])), _t([[2.0, 4.0]]))


def test_critic_shards_name_bad_arguments():
    ids = torch.tensor([0, 0, 1])
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(ValueError, match=rf"^num_critics is {bad!r}, expected an int >= 1$".replace("(", r"\(")):
            critic_shards(ids, bad)
    for dtype in (torch.float32, torch.bool, torch.complex64):
        with pytest.raises(ValueError, match=rf"^group_ids has dtype {dtype}, expected an integer dtype$"):
            critic_shards(torch.zeros(3, dtype=dtype), 2)
    with pytest.raises(ValueError, match=r"^group_ids has shape \[1, 3\], expected 1 dimensions$"):
        critic_shards(ids[None], 2)
    assert critic_shards(ids, 1).tolist() == [0, 0, 0]
    assert critic_shards(torch.tensor([5, 7, 5, 5, 7], dtype=torch.int32), 2).tolist() == [0, 0, 1, 0, 1]
    out = critic_shards(torch.zeros(0, dtype=torch.long), 3)
    assert out.shape == (0,) and out.dtype == torch.long


def test_masks_name_bad_arguments():
    v = torch.zeros(2, 1, 3, dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^mask has shape \[3\], expected 2 dimensions$"):
        asyppo_masks(v, torch.ones(3, dtype=torch.bool), 0.2, 0.2)
    with pytest.raises(ValueError, match=r"^values has dtype torch.int64, expected a floating dtype$"):
        asyppo_masks(torch.zeros(2, 1, 3, dtype=torch.long), mask, 0.2, 0.2)
    with pytest.raises(
        ValueError, match=r"^values has shape \[2, 1, 4\], expected \[M, 1, 3\] \(M critics\) matching mask \[1, 3\]$"
    ):
        asyppo_masks(torch.zeros(2, 1, 4, dtype=F64), mask, 0.2, 0.2)
    with pytest.raises(ValueError, match=r"^values has shape \[1, 3\], expected \[M, 1, 3\]"):
        asyppo_masks(torch.zeros(1, 3, dtype=F64), mask, 0.2, 0.2)
    with pytest.raises(
        ValueError, match=r"^values has shape \[1, 2, 3\]: 1 critic\(s\), expected M >= 2 \(sigma is a std over critics\)$"
    ):
        asyppo_masks(torch.zeros(1, 2, 3, dtype=F64), torch.ones(2, 3, dtype=torch.bool), 0.2, 0.2)
    for name, args in (("low_frac", (1.5, 0.0)), ("high_frac", (0.0, -0.1)), ("low_frac", (True, 0.0)),
                       ("high_frac", (0.0, "0.2"))):
        with pytest.raises(ValueError, match=rf"^{name} is .*, expected a number in \[0, 1\]$"):
            asyppo_masks(v, mask, *args)
    with pytest.raises(ValueError, match=r"^low_frac \+ high_frac is 0.6 \+ 0.5 = 1.1, expected at most 1$"):
        asyppo_masks(v, mask, 0.6, 0.5)
    bad = v.clone()
    bad[1, 0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^values has non-finite values"):
        asyppo_masks(bad, mask, 0.2, 0.2)
    # NaN on an invalid token is ignored; the shares may sum to exactly 1
    adv_keep, ent_keep = asyppo_masks(bad, torch.tensor([[True, True, False]]), 0.5, 0.5)
    assert adv_keep.tolist() == [[False, True, False]] and ent_keep.tolist() == [[True, False, False]]


def test_masks_on_a_hand_worked_batch():
    # 2 critics, 1 x 5 tokens, sigma = |V1 - V2| / 2 = [0.5, 0.1, 0.3, 0.2, 0.4]; token 4 invalid
    v1 = _t([[[1.0, 0.2, 0.6, 0.4, 0.8]]])
    values = torch.cat([v1, torch.zeros_like(v1)])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # 0/1 floating mask: n = 4 valid tokens
    adv_keep, ent_keep = asyppo_masks(values, mask, 0.5, 0.25)
    # k_low = floor(0.5 * 4) = 2: the lowest sigmas 0.1 (t1) and 0.2 (t3); k_high = 1: the highest, 0.5 (t0)
    assert adv_keep.tolist() == [[True, False, True, False, False]]
    assert ent_keep.tolist() == [[False, True, True, True, False]]
    assert adv_keep.dtype == torch.bool and ent_keep.dtype == torch.bool
    # a share of 1 drops every valid token
    adv_keep, ent_keep = asyppo_masks(values, mask, 1.0, 0.0)
    assert adv_keep.tolist() == [[False] * 5] and ent_keep.tolist() == [[True, True, True, True, False]]
    adv_keep, ent_keep = asyppo_masks(values, mask, 0, 1)
    assert adv_keep.tolist() == [[True, True, True, True, False]] and ent_keep.tolist() == [[False] * 5]
    # zero shares drop nothing
    adv_keep, ent_keep = asyppo_masks(values, mask, 0, 0)
    assert adv_keep.tolist() == ent_keep.tolist() == [[True, True, True, True, False]]
    # half precision values are ranked like the float32 ones
    a16, e16 = asyppo_masks(values.half(), mask, 0.5, 0.25)
    assert a16.tolist() == [[True, False, True, False, False]] and e16.tolist() == [[False, True, True, True, False]]
