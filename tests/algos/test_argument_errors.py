"""Edge cases of credo.algos that the seed-3 mutation sample showed untested: fractional frequency weights, empty
chunk layouts, the documented defaults, and the exact error each bad argument gets (anchored, naming the tensor)."""

from __future__ import annotations

import pytest
import torch

from credo.algos import ipa_loss, normalize_rewards, rebn, train_infer_correction
from credo.algos.chunks import num_chunks
from credo.algos.logprobs import logprobs_from_hidden
from credo.algos.policy_losses import topr


def test_fractional_weights_are_frequencies_whose_total_may_be_one_or_less():
    # weights 0.5 and 0.5 on rewards 1 and 3, population std: mean 2, variance (0.5 + 0.5) / 1 = 1
    got = normalize_rewards(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.zeros(2, dtype=torch.long),
                            sample_weights=torch.tensor([0.5, 0.5]), unbiased=False, eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-1.0, 1.0], dtype=torch.float64))
    # total weight 0.5: mean 2 still, variance (0.25 + 0.25) / 0.5 = 1
    got = normalize_rewards(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.zeros(2, dtype=torch.long),
                            sample_weights=torch.tensor([0.25, 0.25]), unbiased=False, eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-1.0, 1.0], dtype=torch.float64))


def test_rebn_names_a_bad_turn_layout():
    g, tm = torch.zeros(2, 3), torch.tensor([[True, True, False], [True, False, False]])
    with pytest.raises(ValueError, match=r"^token_turn_ids has shape \[1, 4\], expected \[2, T\] like turn_rewards$"):
        rebn(g, tm, torch.zeros(1, 4, dtype=torch.long))
    ids = torch.tensor([[0, 1, 2], [0, 0, -1]])  # turn 2 of sample 0 is masked out
    with pytest.raises(ValueError, match=r"^token_turn_ids points at turns where turn_mask is 0$"):
        rebn(g, tm, ids)


def test_num_chunks_of_an_empty_layout_is_int64_zeros():
    got = num_chunks(torch.zeros(3, 0, dtype=torch.long))
    assert got.dtype == torch.int64 and torch.equal(got, torch.zeros(3, dtype=torch.int64))


def test_train_infer_correction_defaults_to_token_level():
    g = torch.Generator().manual_seed(0)
    old, rollout = -torch.rand(2, 5, generator=g), -torch.rand(2, 5, generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    w_default, keep_default, _ = train_infer_correction(old, rollout, mask, mode="tis", cap=1.5)
    w_token, keep_token, _ = train_infer_correction(old, rollout, mask, mode="tis", level="token", cap=1.5)
    assert torch.equal(w_default, w_token) and torch.equal(keep_default, keep_token)


def test_ipa_and_topr_name_their_bad_arguments():
    lp, mask = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^chunk_ids is -1 on a masked-in token, expected a chunk index >= 0$"):
        ipa_loss(lp, lp, lp, mask, chunk_ids=torch.tensor([[0, -1, 1]]))
    with pytest.raises(ValueError, match=r"^ratio_level is 'turn', expected 'token' or 'sequence'$"):
        topr(lp, lp, lp, mask, ratio_level="turn")


def test_labels_on_another_device_are_named():
    # the meta device stands in for a GPU on this CPU-only suite
    hidden, weight = torch.zeros(2, 3, 4), torch.zeros(5, 4)
    labels = torch.zeros(2, 3, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match=r"^labels is on meta, expected cpu like hidden$"):
        logprobs_from_hidden(hidden, weight, labels)


def test_chunk_functions_and_rebn_name_the_tensor_and_its_reference():
    from credo.algos.chunks import chunk_mean, chunk_ratio

    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[2, 2\], expected \[2, 3\] like log_probs$"):
        chunk_ratio(lp, lp, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^chunk_ids has shape \[3\], expected \[B, T\]$"):
        num_chunks(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^chunk_ids holds a chunk index >= max_chunks=2$"):
        chunk_mean(lp, torch.tensor([[0, 1, 2], [0, 0, 1]]), max_chunks=2)
    with pytest.raises(ValueError, match=r"^turn_mask has shape \[2, 2\], expected \[2, 3\] like turn_rewards$"):
        rebn(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.long))


def test_a_new_advantage_estimator_is_registered_with_its_inputs():
    from credo.algos import ADVANTAGE_ESTIMATORS, ADVANTAGE_INPUTS, register_advantage_estimator

    def my_estimator(rewards, group_ids, mask):
        return torch.zeros(mask.shape)

    try:
        assert register_advantage_estimator("test_only_zero", inputs="outcome")(my_estimator) is my_estimator
        assert ADVANTAGE_ESTIMATORS["test_only_zero"] is my_estimator
        assert ADVANTAGE_INPUTS["test_only_zero"] == "outcome"
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_only_zero", None)
        ADVANTAGE_INPUTS.pop("test_only_zero", None)


def test_tis_needs_a_positive_cap_and_mismatch_metrics_a_finite_sampler():
    from credo.algos.mismatch import mismatch_metrics

    lp, mask = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"correction_cap"):
        train_infer_correction(lp, lp, mask, mode="tis", cap=0.0)
    bad = torch.tensor([[0.0, float("nan"), 0.0]])
    with pytest.raises(ValueError, match=r"^sampler_log_probs has non-finite values"):
        mismatch_metrics(lp, bad, mask)


def test_value_loss_passes_norm_len_to_the_aggregation():
    from credo.algos import value_loss

    # one sequence, two trained tokens with squared errors 1 and 4: token sum 5, halved 2.5, over norm_len 10
    values = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    zeros = torch.zeros(1, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    loss, _ = value_loss(values, zeros, zeros, mask, clip_range=None, agg_mode="seq-mean-token-sum-norm", norm_len=10)
    assert loss.item() == pytest.approx(0.25)


def test_mipu_t_post_clamps_the_mean_log_ratio_at_plus_and_minus_20():
    import math

    from credo.algos.mipu import mipu_t_post

    # row 0: mean log-ratio +30 -> rho e^20; row 1: -30 -> rho e^-20; advantages 1 and -1
    lp = torch.tensor([[30.0, 30.0], [-30.0, -30.0]], dtype=torch.float64)
    got = mipu_t_post(lp, torch.zeros(2, 2, dtype=torch.float64), torch.tensor([1.0, -1.0], dtype=torch.float64),
                      torch.ones(2, 2, dtype=torch.bool))
    assert got == pytest.approx(-(math.exp(20) - math.exp(-20)) / 2, rel=1e-12)
