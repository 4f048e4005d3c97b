"""The shared argument checks of credo.algos._validate, the KL estimators at their clamps and the entropy at its edges:
every message anchored (it names the argument), every default, every returned value derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from credo.algos import _validate as V
from credo.algos import entropy_from_logits
from credo.algos.kl import KL_ESTIMATORS, k1, k2, k3, k3_clamped, register_kl_estimator

# --------------------------------------------------------------------------------------------- _validate


def test_shape_str_lists_every_dimension():
    assert V.shape_str(torch.zeros(2, 3)) == "[2, 3]"
    assert V.shape_str(torch.zeros(4)) == "[4]"
    assert V.shape_str(torch.tensor(1.0)) == "[]"
    assert V.shape_str(torch.zeros(1, 0, 5)) == "[1, 0, 5]"


def test_log_ratio_clamp_is_20():
    assert V.LOG_RATIO_CLAMP == 20.0


def test_check_tensor_names_a_non_tensor_a_bad_rank_and_an_integer_dtype():
    with pytest.raises(ValueError, match=r"^rewards must be a torch\.Tensor, got list$"):
        V.check_tensor("rewards", [1.0, 2.0])
    with pytest.raises(ValueError, match=r"^rewards must be a torch\.Tensor, got NoneType$"):
        V.check_tensor("rewards", None, ndim=1, floating=True)
    with pytest.raises(ValueError, match=r"^rewards has shape \[2, 3\], expected 1 dimensions$"):
        V.check_tensor("rewards", torch.zeros(2, 3), ndim=1)
    with pytest.raises(ValueError, match=r"^rewards has shape \[\], expected 1 dimensions$"):
        V.check_tensor("rewards", torch.tensor(0.0), ndim=1)
    with pytest.raises(ValueError, match=r"^rewards has dtype torch\.int32, expected a floating dtype$"):
        V.check_tensor("rewards", torch.zeros(2, dtype=torch.int32), ndim=1, floating=True)
    # the defaults: any rank, any dtype
    assert V.check_tensor("x", torch.zeros(2, 3, 4, dtype=torch.long)) is None
    assert V.check_tensor("x", torch.tensor(True)) is None
    assert V.check_tensor("x", torch.zeros(2, dtype=torch.float16), ndim=1, floating=True) is None


def test_check_like_compares_shapes_and_is_floating_by_default():
    ref = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^values has shape \[3, 2\], expected \[2, 3\] like token_rewards$"):
        V.check_like("values", torch.zeros(3, 2), "token_rewards", ref)
    with pytest.raises(ValueError, match=r"^values has dtype torch\.int64, expected a floating dtype$"):
        V.check_like("values", torch.zeros(2, 3, dtype=torch.long), "token_rewards", ref)
    with pytest.raises(ValueError, match=r"^values must be a torch\.Tensor, got float$"):
        V.check_like("values", 0.5, "token_rewards", ref)
    assert V.check_like("values", torch.zeros(2, 3, dtype=torch.long), "token_rewards", ref, floating=False) is None
    assert V.check_like("values", torch.ones(2, 3, dtype=torch.float64), "token_rewards", ref) is None


def test_as_bool_mask_accepts_bool_and_binary_floats_only():
    ref = torch.zeros(2, 2)
    m = torch.tensor([[True, False], [False, True]])
    assert V.as_bool_mask(m, "values", ref) is m  # a bool mask is returned as it is
    got = V.as_bool_mask(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), "values", ref)
    assert got.dtype == torch.bool and torch.equal(got, m)
    got = V.as_bool_mask(torch.tensor([[-0.0, 1.0], [1.0, 0.0]], dtype=torch.float16), "values", ref)
    assert torch.equal(got, torch.tensor([[False, True], [True, False]]))
    with pytest.raises(ValueError, match=r"^mask has shape \[2\], expected \[2, 2\] like values$"):
        V.as_bool_mask(torch.ones(2, dtype=torch.bool), "values", ref)
    with pytest.raises(ValueError, match=r"^turn_mask has shape \[1, 2\], expected \[2, 2\] like turn_rewards$"):
        V.as_bool_mask(torch.ones(1, 2, dtype=torch.bool), "turn_rewards", ref, name="turn_mask")
    with pytest.raises(ValueError, match=r"^mask has dtype torch\.int64, expected bool or floating \(0/1 values\)$"):
        V.as_bool_mask(torch.ones(2, 2, dtype=torch.long), "values", ref)
    with pytest.raises(ValueError, match=r"^turn_mask has dtype torch\.uint8, expected bool or floating \(0/1 values\)$"):
        V.as_bool_mask(torch.ones(2, 2, dtype=torch.uint8), "values", ref, name="turn_mask")
    with pytest.raises(
        ValueError, match=r"^mask has values other than 0 and 1; pass fractional per-token weights as weights=$"
    ):
        V.as_bool_mask(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "values", ref)
    with pytest.raises(ValueError, match=r"^turn_mask has values other than 0 and 1"):
        V.as_bool_mask(torch.tensor([[1.0, 0.5], [0.0, 1.0]]), "values", ref, name="turn_mask")
    with pytest.raises(ValueError, match=r"^turn_mask must be a torch\.Tensor, got list$"):
        V.as_bool_mask([[1, 0], [0, 1]], "values", ref, name="turn_mask")


def test_check_finite_looks_only_inside_the_mask_and_says_so():
    x = torch.tensor([[0.0, float("nan")], [float("-inf"), 1.0]])
    with pytest.raises(ValueError, match=r"^x has non-finite values \(NaN or Inf\)$"):
        V.check_finite("x", x)
    with pytest.raises(ValueError, match=r"^x has non-finite values \(NaN or Inf\) in masked-in positions$"):
        V.check_finite("x", x, torch.tensor([[False, False], [True, False]]))
    assert V.check_finite("x", x, torch.tensor([[True, False], [False, True]])) is None
    assert V.check_finite("x", torch.tensor([float("inf")]), torch.tensor([False])) is None
    with pytest.raises(ValueError, match=r"^y has non-finite values \(NaN or Inf\)$"):
        V.check_finite("y", torch.tensor([1.0, float("inf")]))
    assert V.check_finite("y", torch.tensor([1e30, -1e30])) is None
    assert V.check_finite("y", torch.zeros(0)) is None


def test_check_choice_lists_the_choices():
    with pytest.raises(ValueError, match=r"^mode is 'sum', expected one of \['a', 'b'\]$"):
        V.check_choice("mode", "sum", ("a", "b"))
    with pytest.raises(ValueError, match=r"^level is None, expected one of \['token'\]$"):
        V.check_choice("level", None, {"token": 1})
    assert V.check_choice("mode", "b", ("a", "b")) is None


def test_check_positive_rejects_zero_negatives_bools_none_and_strings():
    for bad, shown in [(0, "0"), (-1, "-1"), (0.0, "0.0"), (-1e-9, "-1e-09"), (True, "True"), (False, "False"),
                       ("3", "'3'"), (None, "None")]:
        with pytest.raises(ValueError, match=rf"^n is {re_escape(shown)}, expected a positive number$"):
            V.check_positive("n", bad)
    for good in (1, 1e-12, 2.5, 10**9):
        assert V.check_positive("n", good) is None
    assert V.check_positive("n", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"^n is 0, expected a positive number$"):
        V.check_positive("n", 0, allow_none=True)
    # a tensor is trusted as it is (checking it would force a device sync), even a zero one
    assert V.check_positive("n", torch.tensor(0)) is None


def re_escape(s):
    import re

    return re.escape(s)


def test_masked_fill_zero_keeps_the_dtype_and_blocks_nan_and_its_gradient():
    x = torch.tensor([1.5, float("nan"), float("inf"), -2.0], dtype=torch.float64, requires_grad=True)
    m = torch.tensor([True, False, False, True])
    y = V.masked_fill_zero(x, m)
    assert y.dtype == torch.float64
    assert y.tolist() == [1.5, 0.0, 0.0, -2.0]
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.tolist() == [1.0, 0.0, 0.0, 1.0]
    # the zero is of x's own dtype: an integer tensor stays integer
    y = V.masked_fill_zero(torch.tensor([3, 4, 5]), torch.tensor([True, False, True]))
    assert y.dtype == torch.int64 and y.tolist() == [3, 0, 5]
    y = V.masked_fill_zero(torch.tensor([0.5, 2.0], dtype=torch.float16), torch.tensor([False, True]))
    assert y.dtype == torch.float16 and y.tolist() == [0.0, 2.0]


def test_register_records_returns_and_refuses_a_different_function_by_name():
    registry: dict = {}

    def fn():
        pass

    def other():
        pass

    assert V.register(registry, "widget", "w", fn) is fn
    assert registry == {"w": fn}
    assert V.register(registry, "widget", "w", fn) is fn  # the same function again (a module reload)
    with pytest.raises(ValueError, match=(
        r"^widget 'w' is already registered by tests\.algos\.test_validate_kl_entropy_boundaries\."
        r"test_register_records_returns_and_refuses_a_different_function_by_name\.<locals>\.fn$"
    )):
        V.register(registry, "widget", "w", other)
    assert registry == {"w": fn}
    # a function of the same module and qualified name counts as the same (a reloaded module's copy)
    same = [lambda: 1, lambda: 2]
    V.register(registry, "widget", "lam", same[0])
    assert V.register(registry, "widget", "lam", same[1]) is same[1] and registry["lam"] is same[1]
    # a falsy old entry is not None: still compared
    registry["zero"] = 0
    with pytest.raises(ValueError, match=r"^widget 'zero' is already registered by \?\.0$"):
        V.register(registry, "widget", "zero", fn)


def test_qualified_names_fall_back_to_question_mark_and_repr():
    assert V._qualified(V.register) == "credo.algos._validate.register"
    assert V._qualified(7) == "?.7"

    class Callable:
        def __repr__(self):
            return "<callable>"

    assert V._qualified(Callable()) == f"{__name__}.<callable>"


# --------------------------------------------------------------------------------------------- KL


def _one(x):
    return torch.tensor([[x]], dtype=torch.float64)


@pytest.mark.parametrize("masked", [False, True])
def test_every_estimator_clamps_the_log_ratio_at_plus_and_minus_20(masked):
    kw = {"mask": torch.ones(1, 1, dtype=torch.bool)} if masked else {}
    # d = 0 - (-30) = 30 -> 20;  d = -30 -> -20
    hi, lo = (_one(0.0), _one(-30.0)), (_one(-30.0), _one(0.0))
    assert k1(*hi, **kw).item() == 20.0 and k1(*lo, **kw).item() == -20.0
    assert k2(*hi, **kw).item() == 200.0 and k2(*lo, **kw).item() == 200.0
    assert k3(*hi, **kw).item() == pytest.approx(math.exp(-20) + 19, rel=1e-15)
    assert k3(*lo, **kw).item() == pytest.approx(math.exp(20) - 21, rel=1e-15)
    assert k3_clamped(*hi, **kw).item() == 10.0 and k3_clamped(*lo, **kw).item() == 10.0
    assert k3_clamped(*lo, max_value=1e12, **kw).item() == pytest.approx(math.exp(20) - 21, rel=1e-15)
    # exactly at the clamp nothing changes
    assert k1(_one(0.0), _one(-20.0), **kw).item() == 20.0
    assert k1(_one(-19.5), _one(0.0), **kw).item() == -19.5


@pytest.mark.parametrize("masked", [False, True])
def test_hand_worked_values_inside_the_clamp(masked):
    lp = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, -1.0, 0.0]], dtype=torch.float64)  # d = 1, 0, -2
    kw = {"mask": torch.ones(1, 3)} if masked else {}  # a 0/1 float mask is accepted
    assert k1(lp, ref, **kw).tolist() == [[1.0, 0.0, -2.0]]
    assert k2(lp, ref, **kw).tolist() == [[0.5, 0.0, 2.0]]
    want = [math.exp(-1) - 1 + 1, 0.0, math.exp(2) - 1 - 2]
    torch.testing.assert_close(k3(lp, ref, **kw)[0], torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(k3_clamped(lp, ref, **kw)[0], torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=0)
    # the default max_value is 10: e^2 - 3 = 4.39 is kept, and a max_value of 1 cuts it
    got = k3_clamped(lp, ref, max_value=1.0, **kw)[0]
    torch.testing.assert_close(got, torch.tensor([math.exp(-1), 0.0, 1.0], dtype=torch.float64), rtol=1e-15, atol=0)
    # d = -2.5: e^2.5 - 3.5 = 8.68 < 10 kept by the default; d = -2.6: e^2.6 - 3.6 = 9.86 kept; d = -2.7: 11.18 -> 10
    for d, want_v in [(-2.5, math.exp(2.5) - 3.5), (-2.6, math.exp(2.6) - 3.6), (-2.7, 10.0)]:
        assert k3_clamped(_one(d), _one(0.0), **({"mask": torch.ones(1, 1)} if masked else {})).item() == pytest.approx(
            want_v, rel=1e-14
        )


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
@pytest.mark.parametrize("masked", [False, True])
def test_kl_gradient_flows_to_log_probs_only(name, masked):
    lp = torch.tensor([[-0.5, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0, -0.25, -40.0]], dtype=torch.float64, requires_grad=True)  # d = 0.5, -0.75, 40 (clamped)
    kw = {"mask": torch.ones(1, 3, dtype=torch.bool)} if masked else {}
    kl = KL_ESTIMATORS[name](lp, ref, **kw)
    kl.sum().backward()
    assert ref.grad is None  # the reference is detached
    d = torch.tensor([0.5, -0.75], dtype=torch.float64)
    want = {"k1": torch.ones(2), "k2": d, "k3": 1 - torch.exp(-d), "k3_clamped": 1 - torch.exp(-d)}[name]
    torch.testing.assert_close(lp.grad[0, :2], want.double(), rtol=1e-12, atol=1e-12)
    assert lp.grad[0, 2].item() == 0.0  # saturated at the clamp: zero gradient


def test_kl_names_its_bad_arguments():
    lp = torch.zeros(2, 3)
    for fn in (k1, k2, k3, k3_clamped):
        with pytest.raises(ValueError, match=r"^log_probs has dtype torch\.int64, expected a floating dtype$"):
            fn(torch.zeros(2, 3, dtype=torch.long), lp)
        with pytest.raises(ValueError, match=r"^log_probs must be a torch\.Tensor, got list$"):
            fn([[0.0]], lp)
        with pytest.raises(ValueError, match=r"^ref_log_probs has dtype torch\.int64, expected a floating dtype$"):
            fn(lp, torch.zeros(2, 3, dtype=torch.long))
        with pytest.raises(ValueError, match=r"^mask has shape \[2\], expected \[2, 3\] like log_probs$"):
            fn(lp, lp, mask=torch.ones(2, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"^mask has dtype torch\.int64, expected bool or floating"):
            fn(lp, lp, mask=torch.ones(2, 3, dtype=torch.long))


def test_kl_without_a_mask_is_elementwise_and_keeps_the_dtype():
    for dtype in (torch.float32, torch.float64):
        lp = torch.tensor([[0.0, -1.0]], dtype=dtype)
        ref = torch.tensor([[-1.0, 0.0]], dtype=dtype)
        for name, fn in KL_ESTIMATORS.items():
            out = fn(lp, ref)
            assert out.dtype == dtype and out.shape == (1, 2), name
    # unmasked: nothing is zeroed, and a NaN input stays NaN (the caller masks)
    got = k1(torch.tensor([[float("nan"), 1.0]]), torch.zeros(1, 2))
    assert math.isnan(got[0, 0].item()) and got[0, 1].item() == 1.0
    # masked: positions outside the mask are exactly 0 whatever they hold
    got = k3(torch.tensor([[float("nan"), -3.0]]), torch.tensor([[0.0, 0.0]]), mask=torch.tensor([[False, True]]))
    assert got[0, 0].item() == 0.0 and got[0, 1].item() == pytest.approx(math.exp(3) - 4, rel=1e-6)


def test_register_kl_estimator_adds_a_new_name_and_refuses_a_taken_one():
    def my_kl(log_probs, ref_log_probs, *, mask=None):
        return log_probs - ref_log_probs

    try:
        assert register_kl_estimator("test_only_kl")(my_kl) is my_kl
        assert KL_ESTIMATORS["test_only_kl"] is my_kl
        assert register_kl_estimator("test_only_kl")(my_kl) is my_kl
    finally:
        KL_ESTIMATORS.pop("test_only_kl", None)
    with pytest.raises(ValueError, match=r"^KL estimator 'k1' is already registered by credo\.algos\.kl\.k1$"):
        register_kl_estimator("k1")(my_kl)
    assert KL_ESTIMATORS["k1"] is k1
    assert set(KL_ESTIMATORS) >= {"k1", "k2", "k3", "k3_clamped"}
    assert KL_ESTIMATORS["k2"] is k2 and KL_ESTIMATORS["k3"] is k3 and KL_ESTIMATORS["k3_clamped"] is k3_clamped


# --------------------------------------------------------------------------------------------- entropy


def test_entropy_names_its_bad_arguments():
    with pytest.raises(ValueError, match=r"^logits has shape \[\], expected \[\.\.\., V\] with a vocabulary dimension$"):
        entropy_from_logits(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^logits has dtype torch\.int64, expected a floating dtype$"):
        entropy_from_logits(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^logits must be a torch\.Tensor, got list$"):
        entropy_from_logits([[0.0, 1.0]])


def test_entropy_hand_worked_shapes_and_banned_tokens():
    # uniform over 4: log 4; one vocabulary entry: 0; a 1-D input gives a 0-d entropy
    h = entropy_from_logits(torch.zeros(4, dtype=torch.float64))
    assert h.shape == () and h.item() == pytest.approx(math.log(4), rel=1e-15)
    assert entropy_from_logits(torch.zeros(2, 3, 1)).tolist() == [[0.0] * 3] * 2
    # p = (1/2, 1/2, 0): the banned token adds 0, not NaN; two tokens at logits (0, log 3): p = (1/4, 3/4)
    logits = torch.tensor([[5.0, 5.0, -float("inf")], [0.0, math.log(3), -float("inf")]], dtype=torch.float64,
                          requires_grad=True)
    h = entropy_from_logits(logits)
    want = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    torch.testing.assert_close(h, torch.tensor(want, dtype=torch.float64), rtol=1e-14, atol=1e-14)
    (g,) = torch.autograd.grad(h.sum(), logits)
    assert torch.isfinite(g).all() and g[0, 2].item() == 0.0 and g[1, 2].item() == 0.0
    # dH/dz_v = -p_v (log p_v + H): for the (1/4, 3/4) row
    H = want[1]
    torch.testing.assert_close(
        g[1, :2], torch.tensor([-0.25 * (math.log(0.25) + H), -0.75 * (math.log(0.75) + H)], dtype=torch.float64)
    )
    # the entropy is non-negative and uses the last dimension
    x = torch.tensor([[[0.0, 0.0], [0.0, 100.0]]])
    got = entropy_from_logits(x)
    assert got.shape == (1, 2) and got[0, 0].item() == pytest.approx(math.log(2)) and 0 <= got[0, 1].item() < 1e-40
