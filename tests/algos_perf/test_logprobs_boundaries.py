"""logprobs_from_hidden / fused_policy_loss_from_hidden: defaults, dtypes, frozen inputs, every error message.

Values are checked against the token-by-token reference of tests/algos_perf/reference.py.
"""

import math
import warnings

import pytest
import torch

from credo.algos.logprobs import fused_policy_loss_from_hidden, logprobs_from_hidden
from tests.algos_perf.reference import grads_of, make_inputs, reference_logprobs_and_entropy


def test_logprobs_defaults_are_temperature_one_no_bias_and_no_entropy():
    hidden, weight, labels, _ = make_inputs((5,), 6, 9, seed=30)
    out = logprobs_from_hidden(hidden, weight, labels)
    assert isinstance(out, torch.Tensor) and out.shape == (5,) and out.dtype == torch.float32
    ref, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_fused_defaults_pass_no_entropy_and_use_temperature_one():
    hidden, weight, labels, _ = make_inputs((5,), 6, 9, seed=31)
    seen = []

    def token_loss(lp, ent):
        seen.append(ent)
        return -lp

    loss, log_probs, entropy = fused_policy_loss_from_hidden(hidden, weight, labels, token_loss)
    assert seen == [None] and entropy is None  # one chunk (the default 1024 rows), no entropy
    ref, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    torch.testing.assert_close(log_probs, ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, -ref.sum(), atol=1e-5, rtol=1e-5)
    assert loss.dtype == torch.float32 and loss.shape == ()


def test_float64_inputs_give_float64_outputs():
    hidden, weight, labels, bias = make_inputs((2, 3), 4, 7, dtype=torch.float64, seed=32, with_bias=True)
    log_probs, entropy = logprobs_from_hidden(hidden, weight, labels, with_entropy=True, bias=bias, chunk_size=4)
    assert log_probs.dtype == entropy.dtype == torch.float64
    loss, log_probs, entropy = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent: -lp - ent, with_entropy=True, bias=bias, chunk_size=4
    )
    assert loss.dtype == log_probs.dtype == entropy.dtype == torch.float64
    assert log_probs.shape == entropy.shape == (2, 3)
    ref_lp, ref_ent = reference_logprobs_and_entropy(hidden, weight, labels, 1.0, bias)
    torch.testing.assert_close(entropy, ref_ent.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(loss, (-ref_lp - ref_ent).sum(), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature, with_bias", [(1.0, False), (0.5, False), (1.0, True)])
def test_half_precision_inputs_match_the_reference_on_the_same_values(dtype, temperature, with_bias):
    # The chunk matmul rounds logits (|z| <~ 4) to the input dtype: within 3e-2 (see the bf16 test)
    hidden, weight, labels, bias = make_inputs((7,), 16, 24, dtype=dtype, seed=33, with_bias=with_bias)
    log_probs, entropy = logprobs_from_hidden(
        hidden, weight, labels, temperature=temperature, chunk_size=3, with_entropy=True, bias=bias
    )
    assert log_probs.dtype == entropy.dtype == torch.float32
    ref_inputs = [None if t is None else t.detach().float().requires_grad_() for t in (hidden, weight, bias)]
    ref_lp, ref_ent = reference_logprobs_and_entropy(ref_inputs[0], ref_inputs[1], labels, temperature, ref_inputs[2])
    torch.testing.assert_close(log_probs, ref_lp.detach(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(entropy, ref_ent.detach(), atol=3e-2, rtol=3e-2)
    loss, fused_lp, fused_ent = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent: -lp + 0 * ent, temperature=temperature, chunk_size=3, bias=bias,
        with_entropy=True,
    )  # fmt: skip
    assert loss.dtype == fused_lp.dtype == fused_ent.dtype == torch.float32
    torch.testing.assert_close(fused_lp, log_probs)
    torch.testing.assert_close(fused_ent, entropy)
    got = grads_of(loss, (hidden, weight, bias))
    want = grads_of(-ref_lp.sum(), ref_inputs)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), w, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_a_bias_alone_gets_its_gradient(with_entropy):
    hidden, weight, labels, bias = make_inputs((6,), 5, 8, seed=34, with_bias=True)
    hidden, weight = hidden.detach(), weight.detach()
    out = logprobs_from_hidden(hidden, weight, labels, chunk_size=4, with_entropy=with_entropy, bias=bias)
    ref_lp, ref_ent = reference_logprobs_and_entropy(hidden, weight, labels, 1.0, bias)
    loss, ref_loss = (out[0].sum() + out[1].sum(), ref_lp.sum() + ref_ent.sum()) if with_entropy else (
        out.sum(), ref_lp.sum())  # fmt: skip
    (got,) = torch.autograd.grad(loss, bias)
    (want,) = torch.autograd.grad(ref_loss, bias)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the same through the fused loss
    fused, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, (lambda lp, ent: lp + ent) if with_entropy else (lambda lp, ent: lp),
        chunk_size=4, with_entropy=with_entropy, bias=bias,
    )  # fmt: skip
    (got,) = torch.autograd.grad(fused, bias)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_gradients_of_hidden_alone_and_weight_alone():
    hidden, weight, labels, _ = make_inputs((7,), 5, 8, seed=35)
    ref_lp, ref_ent = reference_logprobs_and_entropy(hidden, weight, labels, 0.7)
    want_h, want_w = grads_of((2 * ref_lp - ref_ent).sum(), (hidden, weight))
    for frozen in ("weight", "hidden"):
        h = hidden.detach() if frozen == "hidden" else hidden
        w = weight.detach() if frozen == "weight" else weight
        loss, _, _ = fused_policy_loss_from_hidden(
            h, w, labels, lambda lp, ent: 2 * lp - ent, temperature=0.7, chunk_size=3, with_entropy=True
        )
        (got,) = torch.autograd.grad(loss, h if frozen == "weight" else w)
        torch.testing.assert_close(got, want_h if frozen == "weight" else want_w, atol=1e-5, rtol=1e-5)


def test_fused_loss_that_ignores_the_log_probs_gives_zero_gradients():
    hidden, weight, labels, _ = make_inputs((5,), 4, 6, seed=36)
    # a constant per-token loss: no gradient reaches the chunk's leaves
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent, c: c, token_inputs=(torch.full((5,), 0.5),), chunk_size=2
    )
    assert loss.item() == 2.5
    grad_h, grad_w = torch.autograd.grad(loss, (hidden, weight))
    assert torch.equal(grad_h, torch.zeros(5, 4)) and torch.equal(grad_w, torch.zeros(6, 4))
    # entropy computed but unused, and log-probs used only in the first row: the other rows add nothing
    mask = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, lambda lp, ent, m: lp * m, token_inputs=(mask,), chunk_size=2, with_entropy=True
    )
    ref_lp, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    got_h, got_w = torch.autograd.grad(loss, (hidden, weight))
    want_h, want_w = grads_of(ref_lp[0], (hidden, weight))
    assert torch.equal(got_h[1:], torch.zeros(4, 4))
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)


def test_fused_token_inputs_reach_the_loss_flattened_and_sliced_by_chunk():
    hidden, weight, labels, _ = make_inputs((2, 3), 4, 6, seed=37)
    seen = []

    def token_loss(lp, ent, a, b):
        seen.append((a.tolist(), b.tolist()))
        return lp * 0

    a, b = torch.arange(6.0).reshape(2, 3), -torch.arange(6.0).reshape(2, 3)
    fused_policy_loss_from_hidden(hidden, weight, labels, token_loss, token_inputs=[a, b], chunk_size=4)
    assert seen == [([0.0, 1.0, 2.0, 3.0], [0.0, -1.0, -2.0, -3.0]), ([4.0, 5.0], [-4.0, -5.0])]


def test_an_int_temperature_is_the_same_as_its_float():
    hidden, weight, labels, _ = make_inputs((4,), 4, 6, seed=38)
    torch.testing.assert_close(
        logprobs_from_hidden(hidden, weight, labels, temperature=2),
        reference_logprobs_and_entropy(hidden, weight, labels, 2.0)[0], atol=1e-5, rtol=1e-5,
    )  # fmt: skip


def test_labels_at_the_vocabulary_edges_are_accepted():
    hidden, weight, _, _ = make_inputs((2,), 4, 6, seed=39)
    labels = torch.tensor([0, 5])
    ref, _ = reference_logprobs_and_entropy(hidden, weight, labels)
    torch.testing.assert_close(logprobs_from_hidden(hidden, weight, labels), ref, atol=1e-5, rtol=1e-5)


def _base():
    return dict(hidden=torch.zeros(3, 4), weight=torch.zeros(10, 4), labels=torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden=torch.tensor(1.0), labels=torch.tensor(0)), r"^hidden has shape \[\], expected \[\.\.\., H\]$"),
        (dict(hidden=torch.zeros(3, 4, dtype=torch.int32)),
         r"^hidden has dtype torch.int32, expected one of float32, bfloat16, float16, float64$"),
        (dict(weight=torch.zeros(4)), r"^weight has shape \[4\], expected \[V, 4\] to match hidden's last dim$"),
        (dict(weight=torch.zeros(2, 10, 4)), r"^weight has shape \[2, 10, 4\], expected \[V, 4\] to match hidden's"),
        (dict(weight=torch.zeros(10, 4, dtype=torch.float64)),
         r"^weight has dtype torch.float64, expected torch.float32 like hidden$"),
        (dict(weight=torch.zeros(10, 4, device="meta")), r"^weight is on meta, expected cpu like hidden$"),
        (dict(labels=torch.zeros(3, dtype=torch.int32)), r"^labels has dtype torch.int32, expected torch.int64$"),
        (dict(labels=torch.zeros(1, 3, dtype=torch.long)), r"^labels has shape \[1, 3\], expected \[3\] like hidden\[\.\.\., 0\]$"),
        (dict(bias=torch.zeros(9)), r"^bias has shape \[9\], expected \[10\] like weight's rows$"),
        (dict(bias=torch.zeros(1, 10)), r"^bias has shape \[1, 10\], expected \[10\] like weight's rows$"),
        (dict(bias=torch.zeros(10, dtype=torch.float64)), r"^bias has dtype torch.float64, expected torch.float32 like weight$"),
        (dict(bias=torch.zeros(10, device="meta")), r"^bias is on meta, expected cpu like weight$"),
        (dict(temperature=-1.0), r"^temperature is -1.0, expected > 0$"),
        (dict(temperature=float("nan")), r"^temperature is nan, expected > 0$"),
        (dict(chunk_size=True), r"^chunk_size is True, expected a positive int$"),
        (dict(chunk_size=2.0), r"^chunk_size is 2.0, expected a positive int$"),
        (dict(chunk_size=-3), r"^chunk_size is -3, expected a positive int$"),
        (dict(labels=torch.tensor([0, 12, -3])), r"^labels contains 12, expected every label in \[0, 10\)$"),
        (dict(labels=torch.tensor([0, -3, 12])), r"^labels contains -3, expected every label in \[0, 10\)$"),
        (dict(hidden=torch.zeros(4), labels=torch.tensor(10)), r"^labels contains 10, expected every label in \[0, 10\)$"),
    ],
)
@pytest.mark.parametrize("fn", ["logprobs", "fused"])
def test_bad_inputs_are_named_by_both_kernels(fn, change, match):
    kwargs = _base()
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        if fn == "logprobs":
            logprobs_from_hidden(**kwargs)
        else:
            fused_policy_loss_from_hidden(token_loss=lambda lp, ent: lp, **kwargs)


def test_chunk_size_one_is_accepted():
    kwargs = _base()
    assert logprobs_from_hidden(**kwargs, chunk_size=1).tolist() == pytest.approx([-math.log(10)] * 3)


def test_fused_token_inputs_are_named():
    kwargs = _base()
    with pytest.raises(ValueError, match=r"^token_inputs\[0\] has shape float, expected \[3\] like labels$"):
        fused_policy_loss_from_hidden(token_loss=lambda lp, ent, x: lp, token_inputs=(1.5,), **kwargs)
    with pytest.raises(ValueError, match=r"^token_inputs\[1\] is on meta, expected cpu like labels$"):
        fused_policy_loss_from_hidden(
            token_loss=lambda lp, ent, x, y: lp, token_inputs=(torch.zeros(3), torch.zeros(3, device="meta")), **kwargs
        )


def test_a_last_partial_chunk_runs_without_warnings():
    # 5 rows in chunks of 2: the last chunk has one row, and every buffer it writes is cut to that row
    hidden, weight, labels, bias = make_inputs((5,), 4, 6, seed=40, with_bias=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_probs, entropy = logprobs_from_hidden(hidden, weight, labels, chunk_size=2, with_entropy=True, bias=bias)
        got = grads_of((log_probs + entropy).sum(), (hidden, weight, bias))
        loss, _, _ = fused_policy_loss_from_hidden(
            hidden, weight, labels, lambda lp, ent: lp + ent, chunk_size=2, with_entropy=True, bias=bias
        )
        fused = grads_of(loss, (hidden, weight, bias))
    ref_lp, ref_ent = reference_logprobs_and_entropy(hidden, weight, labels, 1.0, bias)
    torch.testing.assert_close(entropy, ref_ent, atol=1e-5, rtol=1e-5)
    want = grads_of((ref_lp + ref_ent).sum(), (hidden, weight, bias))
    for g, f, w in zip(got, fused, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(f, w, atol=1e-5, rtol=1e-5)
