import pytest
import torch

from credo.algos.logprobs import fused_policy_loss_from_hidden
from tests.algos_perf.reference import grads_of, make_inputs, reference_logprobs_and_entropy


def clipped_loss_with_entropy_bonus(log_probs, entropy, old_log_probs, advantages, token_weights):
    """PPO-clip per-token loss minus an entropy bonus, weighted per token (mask / global token count)."""
    ratio = torch.exp(log_probs - old_log_probs)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    if entropy is not None:
        loss = loss - 0.05 * entropy
    return loss * token_weights


def policy_inputs(lead_shape, seed):
    gen = torch.Generator().manual_seed(seed)
    old_log_probs = -3 + torch.randn(lead_shape, generator=gen) * 0.3
    advantages = torch.randn(lead_shape, generator=gen)
    mask = torch.rand(lead_shape, generator=gen) > 0.3
    return old_log_probs, advantages, mask.float() / mask.sum()


@pytest.mark.parametrize(
    "lead_shape, chunk_size, temperature, with_bias, with_entropy",
    [
        ((3, 7), 4, 0.9, True, True),  # 4 does not divide 21 rows
        ((3, 7), 4, 1.0, False, False),  # token_loss receives entropy=None
        ((5,), 16, 1.2, True, True),  # fewer rows than one chunk
    ],
)
def test_loss_and_grads_match_autograd_on_reference(lead_shape, chunk_size, temperature, with_bias, with_entropy):
    hidden, weight, labels, bias = make_inputs(lead_shape, 16, 40, seed=11, with_bias=with_bias)
    token_inputs = policy_inputs(lead_shape, seed=12)
    inputs = (hidden, weight, bias)
    loss, log_probs, entropy = fused_policy_loss_from_hidden(
        hidden, weight, labels, clipped_loss_with_entropy_bonus, token_inputs=token_inputs,
        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy, bias=bias,
    )  # fmt: skip
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels, temperature, bias)
    ref_loss = clipped_loss_with_entropy_bonus(
        ref_log_probs, ref_entropy if with_entropy else None, *token_inputs
    ).sum()
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(log_probs, ref_log_probs.detach(), atol=1e-5, rtol=1e-5)
    assert not log_probs.requires_grad
    if with_entropy:
        torch.testing.assert_close(entropy, ref_entropy.detach(), atol=1e-5, rtol=1e-5)
    else:
        assert entropy is None
    # Upstream gradient 2.5, as from a loss scaled for gradient accumulation.
    got = grads_of(2.5 * loss, inputs)
    want = grads_of(2.5 * ref_loss, inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_float64_matches_reference_tightly():
    # float64 leaves only summation-order differences, so a wrong term cannot hide in the tolerance.
    hidden, weight, labels, bias = make_inputs((9,), 6, 11, dtype=torch.float64, seed=13, with_bias=True)
    token_inputs = [t.double() for t in policy_inputs((9,), seed=14)]
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, clipped_loss_with_entropy_bonus, token_inputs=token_inputs,
        temperature=0.7, chunk_size=2, with_entropy=True, bias=bias,
    )  # fmt: skip
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels, 0.7, bias)
    ref_loss = clipped_loss_with_entropy_bonus(ref_log_probs, ref_entropy, *token_inputs).sum()
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-10)
    for g, w in zip(grads_of(loss, (hidden, weight, bias)), grads_of(ref_loss, (hidden, weight, bias))):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-10)


def test_bf16_matches_fp32_reference_within_bf16_tolerance():
    # Same tolerance reasoning as for logprobs_from_hidden: logits rounded to bf16 (relative 2**-8).
    hidden, weight, labels, _ = make_inputs((12,), 32, 64, dtype=torch.bfloat16, seed=15)
    token_inputs = policy_inputs((12,), seed=16)
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, clipped_loss_with_entropy_bonus, token_inputs=token_inputs, chunk_size=5,
        with_entropy=True,
    )  # fmt: skip
    ref_hidden, ref_weight = (t.detach().float().requires_grad_() for t in (hidden, weight))
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(ref_hidden, ref_weight, labels)
    ref_loss = clipped_loss_with_entropy_bonus(ref_log_probs, ref_entropy, *token_inputs).sum()
    torch.testing.assert_close(loss, ref_loss, atol=3e-2, rtol=3e-2)
    got = grads_of(loss, (hidden, weight))
    want = grads_of(ref_loss, (ref_hidden, ref_weight))
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w, atol=3e-2, rtol=3e-2)


def test_loss_of_entropy_only_and_frozen_weight():
    hidden, weight, labels, _ = make_inputs((10,), 8, 20, seed=17)
    weight = weight.detach()
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent: -ent, chunk_size=3, with_entropy=True
    )
    _, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels)
    (got,) = torch.autograd.grad(loss, hidden)
    (want,) = torch.autograd.grad(-ref_entropy.sum(), hidden)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_no_grad_mode_returns_the_loss_without_a_graph():
    hidden, weight, labels, _ = make_inputs((6,), 8, 20, seed=18)
    with torch.no_grad():
        loss, log_probs, _ = fused_policy_loss_from_hidden(hidden, weight, labels, lambda lp, ent: -lp, chunk_size=4)
    ref_log_probs, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, -ref_log_probs.sum().detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(log_probs, ref_log_probs.detach(), atol=1e-5, rtol=1e-5)


def test_second_backward_raises():
    hidden, weight, labels, _ = make_inputs((4,), 8, 20, seed=19)
    loss, _, _ = fused_policy_loss_from_hidden(hidden, weight, labels, lambda lp, ent: -lp)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward per forward"):
        loss.backward()


def test_token_input_shape_mismatch_raises():
    hidden, weight, labels, _ = make_inputs((2, 3), 8, 20, seed=20)
    with pytest.raises(ValueError, match=r"token_inputs\[1\] has shape \[3, 2\], expected \[2, 3\] like labels"):
        fused_policy_loss_from_hidden(
            hidden, weight, labels, lambda lp, ent, x, y: lp, token_inputs=(torch.zeros(2, 3), torch.zeros(3, 2))
        )


def test_minus_inf_bias_masks_vocab_without_nan():
    hidden, weight, labels, _ = make_inputs((6,), 8, 12, seed=21)
    labels = labels % 9
    bias = torch.zeros(12)
    bias[9:] = float("-inf")
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent: -lp - 0.1 * ent, chunk_size=4, with_entropy=True, bias=bias
    )
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight[:9], labels)
    ref_loss = (-ref_log_probs - 0.1 * ref_entropy).sum()
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    got_h, got_w = grads_of(loss, (hidden, weight))
    want_h, want_w = grads_of(ref_loss, (hidden, weight))
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w[:9], want_w[:9], atol=1e-5, rtol=1e-5)
    assert torch.equal(got_w[9:], torch.zeros(3, 8))
