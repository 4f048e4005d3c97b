"""train_infer_correction at its boundaries: defaults, exact bounds, empty sequences, the +-20 clamp, errors.

Every expected value is worked by hand from the definitions in credo/algos/corrections.py's docstring.
"""

import math

import pytest
import torch

from credo.algos import train_infer_correction

F64 = torch.float64
LOG2 = math.log(2.0)


def _ratios(log_rho, mask=None):
    """(old, rollout, mask) with old - rollout = log_rho (rollout 0), all tokens in by default."""
    old = torch.tensor(log_rho, dtype=F64)
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return old, torch.zeros_like(old), mask


def test_defaults_are_token_level_tis_with_a_cap_of_two():
    old, rollout, mask = _ratios([[math.log(3.0), 0.0, math.log(1.5)]])
    w, keep, m = train_infer_correction(old, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 1.5]], dtype=F64))
    assert keep.dtype == torch.bool and keep.tolist() == [[True, True, True]]
    assert set(m) == {"mismatch_kl_k3", "mismatch_kl_k1", "is_weight_mean", "is_ess", "is_capped_frac"}
    assert m["is_capped_frac"].item() == pytest.approx(1 / 3)
    assert m["is_weight_mean"].item() == pytest.approx(4.5 / 3)


def test_mis_default_band_is_one_half_to_two():
    rho = [0.4, 0.6, 1.9, 2.1]
    old, rollout, mask = _ratios([[math.log(r) for r in rho]])
    w, keep, m = train_infer_correction(old, rollout, mask, mode="mis")
    assert keep.tolist() == [[False, True, True, False]]
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.6, 1.9, 0.0]], dtype=F64))
    assert set(m) == {"mismatch_kl_k3", "mismatch_kl_k1", "is_weight_mean", "is_ess", "is_rejected_frac"}
    assert m["is_rejected_frac"].item() == pytest.approx(0.5)
    # rejected tokens stay units of the token-level ESS with weight 0, and stay in the weight mean's count
    assert m["is_ess"].item() == pytest.approx(2.5**2 / (4 * (0.36 + 3.61)))
    assert m["is_weight_mean"].item() == pytest.approx(2.5 / 4)


def test_a_ratio_exactly_at_the_cap_or_the_band_edges_is_kept_and_not_flagged():
    old, rollout, mask = _ratios([[0.0, 0.0]])  # rho = 1 exactly
    w, keep, m = train_infer_correction(old, rollout, mask, mode="tis", cap=1.0)
    assert w.tolist() == [[1.0, 1.0]] and m["is_capped_frac"].item() == 0.0
    w, keep, m = train_infer_correction(old, rollout, mask, mode="mis", low=1.0, high=1.0)
    assert keep.tolist() == [[True, True]] and w.tolist() == [[1.0, 1.0]]
    assert m["is_rejected_frac"].item() == 0.0 and m["is_ess"].item() == 1.0


def test_mode_none_gives_unit_weights_inside_the_mask_and_only_the_shared_metrics():
    old, rollout, mask = _ratios([[LOG2, 5.0, -LOG2]], [[True, False, True]])
    w, keep, m = train_infer_correction(old, rollout, mask, mode=None)
    assert w.tolist() == [[1.0, 0.0, 1.0]] and w.dtype == F64
    assert torch.equal(keep, mask)
    assert set(m) == {"mismatch_kl_k3", "mismatch_kl_k1", "is_weight_mean", "is_ess"}
    assert m["is_weight_mean"].item() == 1.0 and m["is_ess"].item() == 1.0
    assert m["mismatch_kl_k1"].item() == pytest.approx(0.0, abs=1e-15)  # -(log 2 - log 2) / 2
    assert m["mismatch_kl_k3"].item() == pytest.approx(((2 - 1 - LOG2) + (0.5 - 1 + LOG2)) / 2)


def _three_sequences():
    # row 0: two tokens in (log-ratios log 2, log 2) and a masked-out 7.0; row 1: empty; row 2: one token, log 1/2
    return _ratios(
        [[LOG2, LOG2, 7.0], [3.0, 3.0, 3.0], [-LOG2, 9.0, 9.0]],
        [[True, True, False], [False, False, False], [True, False, False]],
    )


def test_sequence_level_tis_counts_only_non_empty_sequences():
    old, rollout, mask = _three_sequences()
    w, keep, m = train_infer_correction(old, rollout, mask, mode="tis", level="sequence", cap=3.0)
    # row 0: rho = 2 * 2 = 4, capped at 3; row 2: rho = 1/2; masked-out tokens and the empty row get 0
    torch.testing.assert_close(w, torch.tensor([[3.0, 3.0, 0.0], [0.0] * 3, [0.5, 0.0, 0.0]], dtype=F64))
    assert torch.equal(keep, mask)
    assert m["is_capped_frac"].item() == pytest.approx(1 / 2)  # 1 of the 2 non-empty sequences
    # units are sequences: mean weights 3 and 0.5
    assert m["is_ess"].item() == pytest.approx(3.5**2 / (2 * (9 + 0.25)))
    assert m["is_weight_mean"].item() == pytest.approx(6.5 / 3)
    assert m["mismatch_kl_k1"].item() == pytest.approx(-LOG2 / 3)
    k3 = 2 * (2 - 1 - LOG2) + (0.5 - 1 + LOG2)
    assert m["mismatch_kl_k3"].item() == pytest.approx(k3 / 3)


def test_sequence_level_fractions_count_each_flagged_sequence():
    # three sequences of two tokens, rho = 4, 4 and 1: two of three capped at 2 (one of three rejected above 1.5)
    old, rollout, mask = _ratios([[LOG2, LOG2], [0.0, 2 * LOG2], [0.5, -0.5]])
    _, _, m = train_infer_correction(old, rollout, mask, mode="tis", level="sequence", cap=2.0)
    assert m["is_capped_frac"].item() == pytest.approx(2 / 3)
    _, keep, m = train_infer_correction(old, rollout, mask, mode="mis", level="sequence", low=0.5, high=1.5)
    assert keep.tolist() == [[False, False], [False, False], [True, True]]
    assert m["is_rejected_frac"].item() == pytest.approx(2 / 3)


def test_geometric_level_divides_by_each_sequence_length():
    old, rollout, mask = _three_sequences()
    # row 0: (2 * 2)^(1/2) = 2, kept; row 2 (one token): 0.5^(1/1) = 0.5 < 0.6, rejected as a whole
    w, keep, m = train_infer_correction(old, rollout, mask, mode="mis", level="geometric", low=0.6, high=2.5)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 0.0], [0.0] * 3, [0.0] * 3], dtype=F64))
    assert keep.tolist() == [[True, True, False], [False] * 3, [False] * 3]
    assert m["is_rejected_frac"].item() == pytest.approx(1 / 2)
    assert m["is_ess"].item() == pytest.approx(2.0**2 / (2 * 4.0))
    assert m["is_weight_mean"].item() == pytest.approx(4 / 3)
    # tis at geometric level on the same rows: weights 2 and 0.5 (nothing capped at 3)
    w, _, m = train_infer_correction(old, rollout, mask, mode="tis", level="geometric", cap=3.0)
    torch.testing.assert_close(w[:, 0], torch.tensor([2.0, 0.0, 0.5], dtype=F64))
    assert m["is_capped_frac"].item() == 0.0


def test_sequence_level_rejection_rejects_every_token_of_the_sequence():
    old, rollout, mask = _ratios([[LOG2, LOG2, -LOG2], [0.1, -0.1, 0.0]])
    # row 0: rho = 2 (> 1.5), all three tokens rejected although the third alone is 1/2; row 1: rho = 1
    w, keep, m = train_infer_correction(old, rollout, mask, mode="mis", level="sequence", low=0.5, high=1.5)
    assert keep.tolist() == [[False] * 3, [True] * 3]
    torch.testing.assert_close(w, torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64))
    assert m["is_rejected_frac"].item() == 0.5


def test_the_importance_ratio_is_clamped_at_e_to_the_plus_and_minus_20():
    # sequence log-ratios +25 and -25: clamped to +-20 before exp
    old, rollout, mask = _ratios([[15.0, 10.0], [-15.0, -10.0]])
    w, keep, _ = train_infer_correction(old, rollout, mask, mode="mis", level="sequence", low=0.0, high=1e9)
    assert keep.all()
    assert w[0].tolist() == pytest.approx([math.exp(20)] * 2, rel=1e-12)
    assert w[1].tolist() == pytest.approx([math.exp(-20)] * 2, rel=1e-12)  # not e^-25
    # the metrics clamp each token's log-ratio too: k3 = e^20 - 1 - 20 for a log-ratio of 25
    old, rollout, mask = _ratios([[25.0]])
    _, _, m = train_infer_correction(old, rollout, mask, mode=None)
    assert m["mismatch_kl_k3"].item() == pytest.approx(math.exp(20) - 21)
    assert m["mismatch_kl_k1"].item() == pytest.approx(-20.0)
    old, rollout, mask = _ratios([[-25.0]])
    _, _, m = train_infer_correction(old, rollout, mask, mode=None)
    assert m["mismatch_kl_k3"].item() == pytest.approx(math.exp(-20) - 1 + 20)
    assert m["mismatch_kl_k1"].item() == pytest.approx(20.0)


def test_everything_rejected_or_an_empty_mask_gives_zero_ess_and_fractions():
    old, rollout, mask = _ratios([[5.0, -5.0]])
    _, keep, m = train_infer_correction(old, rollout, mask, mode="mis")
    assert not keep.any() and m["is_ess"].item() == 0.0 and m["is_rejected_frac"].item() == 1.0
    old, rollout, mask = _ratios([[5.0, -5.0]], [[False, False]])
    for mode, key in (("tis", "is_capped_frac"), ("mis", "is_rejected_frac")):
        for level in ("token", "sequence"):
            w, keep, m = train_infer_correction(old, rollout, mask, mode=mode, level=level)
            assert w.tolist() == [[0.0, 0.0]] and not keep.any()
            assert {k: v.item() for k, v in m.items()} == {
                "mismatch_kl_k3": 0.0, "mismatch_kl_k1": 0.0, "is_weight_mean": 0.0, "is_ess": 0.0, key: 0.0
            }  # fmt: skip


def test_non_finite_values_outside_the_mask_are_ignored():
    old = torch.tensor([[LOG2, float("nan"), float("inf")]], dtype=torch.float32)
    rollout = torch.tensor([[0.0, float("-inf"), 1.0]], dtype=torch.float32)
    mask = torch.tensor([[1.0, 0.0, 0.0]])  # a 0/1 float mask
    for level in ("token", "sequence", "geometric"):
        w, keep, m = train_infer_correction(old, rollout, mask, mode="tis", level=level)
        torch.testing.assert_close(w, torch.tensor([[2.0, 0.0, 0.0]]))
        assert keep.tolist() == [[True, False, False]]
        assert all(bool(torch.isfinite(v)) for v in m.values())
        assert m["is_weight_mean"].dtype == torch.float32 and m["is_weight_mean"].item() == pytest.approx(2.0)


def test_the_weights_carry_no_gradient():
    old = torch.zeros(1, 2, requires_grad=True)
    rollout = torch.zeros(1, 2, requires_grad=True)
    w, _, m = train_infer_correction(old, rollout, torch.ones(1, 2, dtype=torch.bool))
    assert not w.requires_grad and not any(v.requires_grad for v in m.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="TIS"), r"^correction is 'TIS', expected one of \[None, 'tis', 'mis'\]$"),
        (dict(level="turn"), r"^correction_level is 'turn', expected one of \['token', 'sequence', 'geometric'\]$"),
        (dict(mode="tis", cap=-1.0), r"^correction_cap is -1.0, expected a positive number$"),
        (dict(mode="mis", high=0.0), r"^correction_high is 0.0, expected a positive number$"),
        (dict(mode="mis", low=-0.1), r"^correction_low is -0.1, expected a number in \[0, correction_high=2.0\]$"),
        (dict(mode="mis", low=3.0, high=2.5), r"^correction_low is 3.0, expected a number in \[0, correction_high=2.5\]$"),
        (dict(mode="mis", low="0.5"), r"^correction_low is '0.5', expected a number in \[0, correction_high=2.0\]$"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    old, rollout, mask = _ratios([[0.0, 0.0]])
    with pytest.raises(ValueError, match=match):
        train_infer_correction(old, rollout, mask, **kwargs)


def test_each_mode_checks_only_its_own_settings():
    old, rollout, mask = _ratios([[0.0, 0.0]])
    # tis ignores a bad band, mis a bad cap, None both
    train_infer_correction(old, rollout, mask, mode="tis", low=-1.0, high=-1.0)
    train_infer_correction(old, rollout, mask, mode="mis", cap=-1.0)
    train_infer_correction(old, rollout, mask, mode=None, cap=-1.0, low=-1.0, high=-1.0)
    # the band's edges are allowed: low = 0 and low = high
    _, keep, _ = train_infer_correction(old, rollout, mask, mode="mis", low=0, high=1.0)
    assert keep.all()
    _, keep, _ = train_infer_correction(old, rollout, mask, mode="mis", low=1, high=1)
    assert keep.all()


def test_bad_tensors_are_named():
    old, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^old_log_probs has shape \[3\], expected 2 dimensions$"):
        train_infer_correction(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^old_log_probs has dtype torch.int64, expected a floating dtype$"):
        train_infer_correction(old.long(), old, mask)
    with pytest.raises(ValueError, match=r"^rollout_log_probs has dtype torch.int64, expected a floating dtype$"):
        train_infer_correction(old, old.long(), mask)
    with pytest.raises(ValueError, match=r"^mask has shape \[2, 2\], expected \[2, 3\] like old_log_probs$"):
        train_infer_correction(old, old, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask has dtype torch.int64, expected bool or floating"):
        train_infer_correction(old, old, torch.ones(2, 3, dtype=torch.long))


def test_one_sequence_with_small_weights():
    old, rollout, mask = _ratios([[-LOG2, 0.0]])  # one sequence, rho = 1/2
    w, _, m = train_infer_correction(old, rollout, mask, mode="tis", level="sequence", cap=0.25)
    assert w.tolist() == [[0.25, 0.25]]
    assert m["is_capped_frac"].item() == 1.0  # 1 of 1 sequence
    assert m["is_ess"].item() == 1.0  # one unit: its ESS is 1 however small its weight
    assert all(v.dtype == F64 and v.shape == () for v in m.values())
    _, keep, m = train_infer_correction(old, rollout, mask, mode="mis", level="sequence", low=0.6)
    assert not keep.any() and m["is_rejected_frac"].item() == 1.0 and m["is_rejected_frac"].dtype == F64
    for level in ("sequence", "geometric"):
        w, keep, m = train_infer_correction(old, rollout, mask, mode=None, level=level)
        assert w.tolist() == [[1.0, 1.0]] and keep.all() and "is_capped_frac" not in m
