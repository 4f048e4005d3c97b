"""aggregate, global_counts, accumulation_dtype and masked_mean on hand-worked inputs: an empty row, a one-token
row, counts below 1, the default mode and norm_len, and the dtype of every result."""

from __future__ import annotations

import pytest
import torch

from credo.algos.aggregation import AGG_MODES, accumulation_dtype, aggregate, global_counts, masked_mean

# rows: (1, 2, [NaN]) -> sum 3 over 2 tokens; (4, 5, 6) masked out entirely; ([inf], 8, 9)... -> 8 over 1 token
VALUES = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0], [float("inf"), 8.0, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [False, False, False], [False, True, False]])


def test_agg_modes_are_the_shared_vocabulary():
    assert AGG_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def test_global_counts_counts_tokens_and_non_empty_rows():
    tokens, seqs = global_counts(MASK)
    assert tokens.dtype == torch.int64 and seqs.dtype == torch.int64
    assert tokens.shape == () and seqs.shape == ()
    assert tokens.item() == 3 and seqs.item() == 2
    tokens, seqs = global_counts(MASK.double())  # a 0/1 float mask counts the same
    assert (tokens.item(), seqs.item()) == (3, 2) and tokens.dtype == torch.int64
    tokens, seqs = global_counts(torch.zeros(2, 4, dtype=torch.bool))
    assert (tokens.item(), seqs.item()) == (0, 0)
    tokens, seqs = global_counts(torch.tensor([[False, False, True]]))  # a row whose only token is the last
    assert (tokens.item(), seqs.item()) == (1, 1)
    tokens, seqs = global_counts(torch.ones(1, 3, dtype=torch.bool))  # one row of 3 tokens: 1 sequence, not 3
    assert (tokens.item(), seqs.item()) == (3, 1)
    tokens, seqs = global_counts(torch.tensor([[True, False], [True, False], [True, False]]))  # 3 rows, one column
    assert (tokens.item(), seqs.item()) == (3, 3)
    with pytest.raises(ValueError, match=r"^mask has values other than 0 and 1"):
        global_counts(torch.full((2, 2), 0.5))


def test_accumulation_dtype_is_at_least_float32():
    assert accumulation_dtype(torch.float16) == torch.float32
    assert accumulation_dtype(torch.bfloat16) == torch.float32
    assert accumulation_dtype(torch.float32) == torch.float32
    assert accumulation_dtype(torch.float64) == torch.float64


def test_every_mode_hand_worked_with_an_empty_row():
    # token-mean: (1 + 2 + 8) / 3; seq-mean-token-mean: (3/2 + 8/1) / 2; seq-mean-token-sum: (3 + 8) / 2;
    # seq-mean-token-sum-norm: (3/3 + 8/3) / 2 with the default norm_len T = 3
    assert aggregate(VALUES, MASK).item() == pytest.approx(11 / 3, rel=1e-15)  # the default mode
    assert aggregate(VALUES, MASK, "token-mean").item() == pytest.approx(11 / 3, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-mean").item() == pytest.approx(9.5 / 2, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum").item() == pytest.approx(11 / 2, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(11 / 6, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_len=2).item() == pytest.approx(11 / 4, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_len=0.5).item() == pytest.approx(11, rel=1e-15)
    # norm_len is ignored by the other modes
    for mode in AGG_MODES[:3]:
        assert aggregate(VALUES, MASK, mode, norm_len=7).item() == aggregate(VALUES, MASK, mode).item()
    # a 0/1 float mask gives the same
    for mode in AGG_MODES:
        assert aggregate(VALUES, MASK.double(), mode).item() == aggregate(VALUES, MASK, mode).item()


def test_global_counts_replace_the_local_ones():
    assert aggregate(VALUES, MASK, global_tokens=11).item() == pytest.approx(1.0, rel=1e-15)
    assert aggregate(VALUES, MASK, global_tokens=torch.tensor(22)).item() == pytest.approx(0.5, rel=1e-15)
    # global_seqs is ignored by token-mean, global_tokens by the sequence modes
    assert aggregate(VALUES, MASK, global_seqs=100).item() == pytest.approx(11 / 3, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum", global_tokens=100).item() == pytest.approx(5.5, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum", global_seqs=4).item() == pytest.approx(11 / 4, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-mean", global_seqs=torch.tensor(19)).item() == pytest.approx(
        9.5 / 19, rel=1e-15)
    got = aggregate(VALUES, MASK, "seq-mean-token-sum-norm", global_seqs=11, norm_len=4)
    assert got.item() == pytest.approx(11 / 4 / 11, rel=1e-15)
    # a count below 1 is clamped to 1 (a fractional count never scales the loss up)
    assert aggregate(VALUES, MASK, global_tokens=0.5).item() == pytest.approx(11.0, rel=1e-15)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum", global_seqs=0.25).item() == pytest.approx(11.0, rel=1e-15)


def test_one_token_and_all_zero_masks():
    v = torch.tensor([[3.0, -7.0]], dtype=torch.float64)
    last = torch.tensor([[False, True]])
    for mode, want in zip(AGG_MODES, (-7.0, -7.0, -7.0, -3.5)):
        assert aggregate(v, last, mode).item() == want, mode
    for mode in AGG_MODES:
        out = aggregate(v, torch.zeros(1, 2, dtype=torch.bool), mode)
        assert out.item() == 0.0 and out.shape == ()
    # a one-token row beside a two-token row: the per-row means, not the token mean
    v2 = torch.tensor([[1.0, 3.0], [10.0, 0.0]], dtype=torch.float64)
    m2 = torch.tensor([[True, True], [True, False]])
    assert aggregate(v2, m2, "seq-mean-token-mean").item() == pytest.approx((2 + 10) / 2)
    assert aggregate(v2, m2, "token-mean").item() == pytest.approx(14 / 3)


def test_gradient_reaches_masked_in_values_only():
    v = VALUES.clone().requires_grad_()
    for mode, want in [
        ("token-mean", [[1 / 3, 1 / 3, 0], [0, 0, 0], [0, 1 / 3, 0]]),
        ("seq-mean-token-mean", [[1 / 4, 1 / 4, 0], [0, 0, 0], [0, 1 / 2, 0]]),
        ("seq-mean-token-sum", [[1 / 2, 1 / 2, 0], [0, 0, 0], [0, 1 / 2, 0]]),
        ("seq-mean-token-sum-norm", [[1 / 6, 1 / 6, 0], [0, 0, 0], [0, 1 / 6, 0]]),
    ]:
        (g,) = torch.autograd.grad(aggregate(v, MASK, mode), v)
        torch.testing.assert_close(g, torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_result_dtypes(dtype):
    v = torch.tensor([[0.5, 1.5], [2.5, 3.0]], dtype=dtype)
    m = torch.tensor([[True, True], [False, True]])
    want = accumulation_dtype(dtype)
    for mode in AGG_MODES:
        assert aggregate(v, m, mode).dtype == want
        assert aggregate(v, m, mode, global_tokens=torch.tensor(3), global_seqs=torch.tensor(2)).dtype == want
    assert aggregate(v, m).item() == pytest.approx(5 / 3, rel=1e-3)
    mm = masked_mean(v, m)
    assert mm.dtype == want and mm.shape == () and mm.item() == pytest.approx(5 / 3, rel=1e-3)


def test_masked_mean_ignores_non_finite_values_outside_the_mask():
    assert masked_mean(VALUES, MASK).item() == pytest.approx(11 / 3, rel=1e-15)
    assert masked_mean(torch.tensor([float("nan"), 4.0]), torch.tensor([False, True])).item() == 4.0
    assert masked_mean(torch.tensor([float("nan")]), torch.tensor([False])).item() == 0.0
