"""Arguments of the attention-credit functions: the zero horizon FAI accepts, and the exact shape errors."""

from __future__ import annotations

import pytest
import torch

from credo.credit.attention import fai, head_span


def test_fai_with_a_zero_horizon_reads_the_diagonal():
    # h_lo = h_hi = 0: T(s) = {s}, so FAI_s = A[s, s]
    attention = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    torch.testing.assert_close(fai(attention, h_lo=0, h_hi=0), torch.tensor([1.0, 0.5, 0.5]))


def test_head_span_names_the_per_head_shape_it_needs():
    with pytest.raises(ValueError, match=r"^attention has shape \[3, 3\], expected \[H, N, N\] or \[L, H, N, N\]$"):
        head_span(torch.eye(3))
    with pytest.raises(ValueError, match=r"^attention has shape \[3, 2\], expected \[\.\.\., N, N\]$"):
        fai(torch.zeros(3, 2))


def test_capture_names_input_ids_of_the_wrong_rank():
    from credo.credit.capture import _check_masks

    with pytest.raises(ValueError, match=r"^input_ids has shape \[5\], expected \[B, N\]$"):
        _check_masks(torch.zeros(5, dtype=torch.long))


def test_window_max_includes_the_first_token():
    from credo.credit.attention import _window_max

    # all tokens are response tokens; windows of the k = 2 tokens before t: t=1 sees {0}, t=2 sees {0, 1}
    best, at = _window_max(torch.tensor([5.0, 1.0, 0.0]), torch.ones(3, dtype=torch.bool), 2)
    assert best.tolist() == [-float("inf"), 5.0, 5.0] and at[1:].tolist() == [0, 0]
