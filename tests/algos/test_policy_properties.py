"""Property tests for every registered policy loss: split invariance, hostile inputs, validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from credo.algos import AGG_MODES, POLICY_LOSSES, global_counts
from tests.algos._inputs import COMMON_CORRECTIONS, grad_of, make_mask, make_policy_inputs
from tests.algos.test_aggregation import micro_batches, split_case
from tests.reference_registry import extra_kwargs, load_registries

load_registries()
LOSS_NAMES = sorted(POLICY_LOSSES)
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _row_kwargs(kwargs, lo, hi, width, B):
    """Slices per-sequence ([B]) and per-token ([B, T]) keyword tensors to a micro-batch."""
    out = {}
    for key, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == B:
            v = v[lo:hi]
            if v.dim() == 2:
                v = v[:, :width]
        out[key] = v
    return out


@pytest.mark.parametrize("name", LOSS_NAMES)
@SETTINGS
@given(case=split_case(), mode=st.sampled_from(AGG_MODES), correction=st.sampled_from(sorted(COMMON_CORRECTIONS)))
def test_split_invariance(name, case, mode, correction):
    """Summing micro-batch losses computed with global counts equals the full-batch loss, with
    the same gradient; micro-batches are split by rows and trimmed to their own padding."""
    B, T, bounds, seed, p_on = case
    g = torch.Generator().manual_seed(seed)
    lp, old, adv, _, common = make_policy_inputs(B, T, g, weights=seed % 2 == 0, rollout=True)
    mask = make_mask(B, T, g, p_on=p_on)
    common.update(COMMON_CORRECTIONS[correction])
    kwargs = extra_kwargs("policy_loss", name, B, T, g)
    tokens, seqs = global_counts(mask)
    agg = {"agg_mode": mode, "global_tokens": tokens, "global_seqs": seqs, "norm_len": T}
    fn = POLICY_LOSSES[name]
    full, _ = fn(lp, old, adv, mask, **common, **kwargs, **agg)
    parts = 0.0
    for (lp_i, old_i, adv_i, mask_i), (lo, hi, width) in micro_batches(bounds, lp, old, adv, mask, mask_index=3):
        extra = _row_kwargs({**common, **kwargs}, lo, hi, width, B)
        loss_i, _ = fn(lp_i, old_i, adv_i, mask_i, **extra, **agg)
        parts = parts + loss_i
    torch.testing.assert_close(torch.as_tensor(parts, dtype=full.dtype), full, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(grad_of(torch.as_tensor(parts), lp), grad_of(full, lp), atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("name", LOSS_NAMES)
@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([(1, 1), (4, 1), (3, 6)]),
    scale=st.sampled_from([30.0, -30.0, 0.0]),
    mode=st.sampled_from(AGG_MODES),
    correction=st.sampled_from(sorted(COMMON_CORRECTIONS)),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_finite_on_hostile_inputs(name, seed, shape, scale, mode, correction, dtype):
    """Log-ratios of ±30 (also against the sampler), single-token sequences and extreme
    advantages give finite losses and gradients."""
    B, T = shape
    g = torch.Generator().manual_seed(seed)
    lp = (-40 * torch.rand(B, T, generator=g)).to(dtype).requires_grad_()
    old = lp.detach() - scale * torch.sign(torch.randn(B, T, generator=g)).to(dtype)
    adv = (100 * torch.randn(B, T, generator=g)).to(dtype)
    mask = make_mask(B, T, g)
    common = dict(COMMON_CORRECTIONS[correction])
    common["rollout_log_probs"] = old + scale * torch.sign(torch.randn(B, T, generator=g)).to(dtype)
    kwargs = extra_kwargs("policy_loss", name, B, T, g)
    loss, metrics = POLICY_LOSSES[name](lp, old, adv, mask, agg_mode=mode, **common, **kwargs)
    assert torch.isfinite(loss)
    assert torch.isfinite(grad_of(loss, lp)).all()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), metrics


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_all_zero_mask_gives_zero_loss_and_gradient(name, mode):
    g = torch.Generator().manual_seed(0)
    lp, old, adv, _, common = make_policy_inputs(3, 4, g, weights=True, rollout=True)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    kwargs = extra_kwargs("policy_loss", name, 3, 4, g)
    loss, metrics = POLICY_LOSSES[name](lp, old, adv, mask, agg_mode=mode, correction="tis", **common, **kwargs)
    assert loss.item() == 0.0
    assert torch.equal(grad_of(loss, lp), torch.zeros(3, 4, dtype=lp.dtype))
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), metrics


POLLUTABLE = ("log_probs", "old_log_probs", "advantages", "weights", "rollout_log_probs")


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_masked_out_values_do_not_leak(name, poison):
    """NaN/Inf in masked-out positions of every input: same loss and gradient as with clean values."""
    g = torch.Generator().manual_seed(1)
    lp, old, adv, mask, common = make_policy_inputs(4, 5, g, weights=True, rollout=True)
    mask[0] = False
    mask[1, 2:] = False
    kwargs = extra_kwargs("policy_loss", name, 4, 5, g)
    fn = POLICY_LOSSES[name]
    for correction in ("tis", "mis"):
        clean, _ = fn(lp, old, adv, mask, correction=correction, correction_level="sequence", **common, **kwargs)
        dirty = {"log_probs": lp.detach().clone(), "old_log_probs": old.clone(), "advantages": adv.clone()}
        dirty.update({k: v.clone() for k, v in common.items()})
        for key in POLLUTABLE:
            dirty[key][~mask] = poison
        dirty_lp = dirty.pop("log_probs").requires_grad_()
        loss, metrics = fn(
            dirty_lp, dirty.pop("old_log_probs"), dirty.pop("advantages"), mask,
            correction=correction, correction_level="sequence", **dirty, **kwargs,
        )
        torch.testing.assert_close(loss, clean)
        torch.testing.assert_close(grad_of(loss, dirty_lp), grad_of(clean, lp))
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), metrics


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("tensor", POLLUTABLE)
def test_nan_in_masked_in_position_raises_naming_the_tensor(name, tensor):
    g = torch.Generator().manual_seed(2)
    lp, old, adv, mask, common = make_policy_inputs(2, 3, g, weights=True, rollout=True)
    mask[1, 1] = True
    args = {"log_probs": lp.detach().clone(), "old_log_probs": old, "advantages": adv, **common}
    args[tensor] = args[tensor].clone()
    args[tensor][1, 1] = float("nan")
    kwargs = extra_kwargs("policy_loss", name, 2, 3, g)
    with pytest.raises(ValueError, match=rf"^{tensor} has non-finite values"):
        POLICY_LOSSES[name](
            args.pop("log_probs"), args.pop("old_log_probs"), args.pop("advantages"), mask,
            correction="tis", **args, **kwargs,
        )


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_validation_errors_name_the_argument(name):
    fn = POLICY_LOSSES[name]
    lp = torch.zeros(4, 9)
    ok = torch.ones(4, 9, dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    kwargs = extra_kwargs("policy_loss", name, 4, 9, g)
    with pytest.raises(ValueError, match=r"advantages has shape \[4, 7\], expected \[4, 9\] like log_probs"):
        fn(lp, lp, torch.zeros(4, 7), ok, **kwargs)
    with pytest.raises(ValueError, match=r"old_log_probs has shape \[4, 8\], expected \[4, 9\] like log_probs"):
        fn(lp, torch.zeros(4, 8), lp, ok, **kwargs)
    with pytest.raises(ValueError, match=r"mask has dtype torch.int64, expected bool or floating"):
        fn(lp, lp, lp, torch.ones(4, 9, dtype=torch.int64), **kwargs)
    with pytest.raises(ValueError, match=r"log_probs has dtype torch.int64, expected a floating dtype"):
        fn(torch.zeros(4, 9, dtype=torch.int64), lp, lp, ok, **kwargs)
    with pytest.raises(ValueError, match=r"log_probs has shape \[9\], expected 2 dimensions"):
        fn(torch.zeros(9), torch.zeros(9), torch.zeros(9), torch.ones(9, dtype=torch.bool), **kwargs)
    with pytest.raises(ValueError, match=r"weights has shape \[4, 1\], expected \[4, 9\] like log_probs"):
        fn(lp, lp, lp, ok, weights=torch.ones(4, 1), **kwargs)
    with pytest.raises(ValueError, match=r"rollout_log_probs has shape \[9\], expected \[4, 9\] like log_probs"):
        fn(lp, lp, lp, ok, rollout_log_probs=torch.zeros(9), **kwargs)
    with pytest.raises(ValueError, match=r"correction is 'is'"):
        fn(lp, lp, lp, ok, rollout_log_probs=lp, correction="is", **kwargs)
    with pytest.raises(ValueError, match=r"correction_level is 'token-mean'"):
        fn(lp, lp, lp, ok, rollout_log_probs=lp, correction="tis", correction_level="token-mean", **kwargs)
    with pytest.raises(ValueError, match=r"(agg_)?mode is 'mean'"):
        fn(lp, lp, lp, ok, agg_mode="mean", **kwargs)
