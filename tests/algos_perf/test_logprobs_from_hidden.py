import pytest
import torch

from credo.algos.logprobs import logprobs_from_hidden
from tests.algos_perf.reference import grads_of, make_inputs, reference_logprobs_and_entropy


@pytest.mark.parametrize(
    "n, chunk_size, temperature, with_bias",
    [
        (37, 8, 1.0, False),  # 8 does not divide 37: last chunk has 5 rows
        (37, 8, 0.7, True),
        (5, 16, 1.3, False),  # fewer rows than one chunk
        (24, 24, 0.5, True),  # exactly one chunk
        (9, 1, 1.0, False),  # one row per chunk
    ],
)
def test_values_and_grads_match_reference_fp32(n, chunk_size, temperature, with_bias):
    hidden, weight, labels, bias = make_inputs((n,), 16, 50, with_bias=with_bias)
    gen = torch.Generator().manual_seed(1)
    up_logp, up_entropy = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    inputs = (hidden, weight, bias)

    log_probs, entropy = logprobs_from_hidden(
        hidden, weight, labels, temperature=temperature, chunk_size=chunk_size, with_entropy=True, bias=bias
    )
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels, temperature, bias)
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)

    # A loss mixing both outputs with random upstream gradients, as a policy loss with an entropy bonus.
    got = grads_of((log_probs * up_logp).sum() + (entropy * up_entropy).sum(), inputs)
    want = grads_of((ref_log_probs * up_logp).sum() + (ref_entropy * up_entropy).sum(), inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)

    # Log-probs alone (the path that keeps one chunk buffer instead of two).
    log_probs_only = logprobs_from_hidden(
        hidden, weight, labels, temperature=temperature, chunk_size=chunk_size, bias=bias
    )
    torch.testing.assert_close(log_probs_only, ref_log_probs, atol=1e-5, rtol=1e-5)
    got = grads_of((log_probs_only * up_logp).sum(), inputs)
    want = grads_of((ref_log_probs * up_logp).sum(), inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use", ["entropy_only", "logp_only"])
def test_grads_when_only_one_output_is_used(use):
    hidden, weight, labels, _ = make_inputs((13,), 8, 30, seed=3)
    log_probs, entropy = logprobs_from_hidden(
        hidden, weight, labels, temperature=0.8, chunk_size=4, with_entropy=True
    )
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels, 0.8)
    used, ref_used = (entropy, ref_entropy) if use == "entropy_only" else (log_probs, ref_log_probs)
    weights = torch.linspace(-1, 2, 13)
    got = grads_of((used * weights).sum(), (hidden, weight))
    want = grads_of((ref_used * weights).sum(), (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_leading_batch_dims_are_flattened_and_restored():
    hidden, weight, labels, bias = make_inputs((3, 7), 12, 40, seed=4, with_bias=True)
    log_probs, entropy = logprobs_from_hidden(
        hidden, weight, labels, temperature=0.9, chunk_size=5, with_entropy=True, bias=bias
    )
    assert log_probs.shape == (3, 7) and entropy.shape == (3, 7)
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels, 0.9, bias)
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    up = torch.randn(3, 7, generator=torch.Generator().manual_seed(5))
    got = grads_of((log_probs * up).sum() - entropy.sum(), (hidden, weight, bias))
    want = grads_of((ref_log_probs * up).sum() - ref_entropy.sum(), (hidden, weight, bias))
    assert got[0].shape == (3, 7, 12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_single_token_hidden_without_leading_dims():
    # hidden [H] with a 0-d label is the [..., H] contract with no leading dims
    hidden, weight, labels, _ = make_inputs((), 6, 9, seed=7)
    assert hidden.shape == (6,) and labels.shape == ()
    log_probs, entropy = logprobs_from_hidden(hidden, weight, labels, with_entropy=True)
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels)
    assert log_probs.shape == () and entropy.shape == ()
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)


def test_rows_with_far_apart_logit_levels_are_each_stable():
    # Row 0's logits sit near +200, row 1's near -200: each row is shifted by its own max, so both
    # give log_softmax([0, 0.5, -0.5]) (float32 exp(-400) would underflow to 0 with a shared shift).
    weight = torch.tensor([[1.0, 0.0], [1.0, 0.5], [1.0, -0.5]], requires_grad=True)
    hidden = torch.tensor([[200.0, 1.0], [-200.0, 1.0]], requires_grad=True)
    labels = torch.tensor([1, 2])
    log_probs, entropy = logprobs_from_hidden(hidden, weight, labels, with_entropy=True)
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight, labels)
    torch.testing.assert_close(log_probs, ref_log_probs)
    torch.testing.assert_close(entropy, ref_entropy)
    torch.testing.assert_close(entropy[0], entropy[1])


def test_frozen_weight_gets_no_grad_and_hidden_grad_is_right():
    hidden, weight, labels, _ = make_inputs((11,), 8, 20, seed=6)
    weight = weight.detach()
    log_probs = logprobs_from_hidden(hidden, weight, labels, chunk_size=3)
    (got,) = torch.autograd.grad(log_probs.sum(), hidden)
    ref_log_probs, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    (want,) = torch.autograd.grad(ref_log_probs.sum(), hidden)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bf16_inputs_match_fp32_reference_within_bf16_tolerance():
    # Tolerance: bf16 keeps 8 significand bits (relative step 2**-8 ~ 3.9e-3). The chunk matmul
    # rounds logits of magnitude <~ 4 to bf16 (abs error <~ 1.6e-2), which moves log-probs and
    # entropies by about as much; gradients are rounded to bf16 again. So atol = rtol = 3e-2.
    hidden, weight, labels, bias = make_inputs((2, 9), 32, 64, dtype=torch.bfloat16, seed=7, with_bias=True)
    log_probs, entropy = logprobs_from_hidden(
        hidden, weight, labels, temperature=0.8, chunk_size=4, with_entropy=True, bias=bias
    )
    assert log_probs.dtype == torch.float32 and entropy.dtype == torch.float32
    # The fp32 reference sees exactly the bf16 values the chunked path sees.
    ref_inputs = [t.detach().float().requires_grad_() for t in (hidden, weight, bias)]
    ref_hidden, ref_weight, ref_bias = ref_inputs
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(ref_hidden, ref_weight, labels, 0.8, ref_bias)
    torch.testing.assert_close(log_probs, ref_log_probs.detach(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(entropy, ref_entropy.detach(), atol=3e-2, rtol=3e-2)

    up = torch.randn(2, 9, generator=torch.Generator().manual_seed(8))
    got = grads_of((log_probs * up).sum() + entropy.sum(), (hidden, weight, bias))
    want = grads_of((ref_log_probs * up).sum() + ref_entropy.sum(), ref_inputs)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w, atol=3e-2, rtol=3e-2)


def test_gradcheck_float64():
    hidden, weight, labels, bias = make_inputs((5,), 3, 7, dtype=torch.float64, seed=9, with_bias=True)

    def both_outputs(h, w, b):
        return logprobs_from_hidden(h, w, labels, temperature=0.8, chunk_size=2, with_entropy=True, bias=b)

    assert torch.autograd.gradcheck(both_outputs, (hidden, weight, bias))


def test_minus_inf_bias_masks_vocab_without_nan():
    # A bias of -inf removes padded vocabulary entries; their p is 0 and must not turn 0 * -inf into NaN.
    hidden, weight, labels, _ = make_inputs((6,), 8, 12, seed=10)
    labels = labels % 9
    bias = torch.zeros(12)
    bias[9:] = float("-inf")
    log_probs, entropy = logprobs_from_hidden(hidden, weight, labels, chunk_size=4, with_entropy=True, bias=bias)
    ref_log_probs, ref_entropy = reference_logprobs_and_entropy(hidden, weight[:9], labels)
    torch.testing.assert_close(log_probs, ref_log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    got_h, got_w = grads_of(log_probs.sum() + entropy.sum(), (hidden, weight))
    want_h, want_w = grads_of(ref_log_probs.sum() + ref_entropy.sum(), (hidden, weight))
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w[:9], want_w[:9], atol=1e-5, rtol=1e-5)
    assert torch.equal(got_w[9:], torch.zeros(3, 8))


def test_empty_input_returns_empty():
    hidden, weight, _, _ = make_inputs((0,), 4, 6)
    log_probs = logprobs_from_hidden(hidden, weight, torch.zeros(0, dtype=torch.long))
    assert log_probs.shape == (0,)
    grad_h, grad_w = torch.autograd.grad(log_probs.sum(), (hidden, weight))
    assert grad_h.shape == (0, 4) and torch.equal(grad_w, torch.zeros(6, 4))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(weight=torch.zeros(10, 5)), "weight has shape \\[10, 5\\], expected \\[V, 4\\]"),
        (dict(weight=torch.zeros(10, 4, dtype=torch.float64)), "weight has dtype torch.float64"),
        (dict(hidden=torch.zeros(3, 4, dtype=torch.int32)), "hidden has dtype"),
        (dict(labels=torch.zeros(3, dtype=torch.int32)), "labels has dtype torch.int32, expected torch.int64"),
        (dict(labels=torch.zeros(4, dtype=torch.long)), "labels has shape \\[4\\], expected \\[3\\]"),
        (dict(labels=torch.tensor([0, 10, 2])), "labels contains 10, expected every label in \\[0, 10\\)"),
        (dict(labels=torch.tensor([0, -1, 2])), "labels contains -1"),
        (dict(bias=torch.zeros(9)), "bias has shape \\[9\\], expected \\[10\\]"),
        (dict(bias=torch.zeros(10, dtype=torch.float64)), "bias has dtype torch.float64"),
        (dict(temperature=0.0), "temperature is 0.0, expected > 0"),
        (dict(chunk_size=0), "chunk_size is 0, expected a positive int"),
    ],
)
def test_invalid_inputs_raise_value_error_naming_the_argument(change, match):
    kwargs = dict(hidden=torch.zeros(3, 4), weight=torch.zeros(10, 4), labels=torch.zeros(3, dtype=torch.long))
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        logprobs_from_hidden(**kwargs)
