"""Token log-probs and entropy from final hidden states without materialising [N, V] logits.

For a sampled token y with hidden state h, the policy log-prob and entropy are

    z = (h @ W.T + b) / T,    log p(y) = z_y - logsumexp(z),    H = logsumexp(z) - sum_j p_j z_j.

With vocabularies of 150k tokens the [N, V] logits (and the autograd buffers around them) dominate
training memory. Following the chunked-loss idea of Liger Kernel (arXiv:2410.10989) and Cut
Cross-Entropy (arXiv:2411.09009), `logprobs_from_hidden` processes rows in chunks, keeps only O(N)
statistics (logsumexp and entropy) for backward, and recomputes each chunk's logits there.
`fused_policy_loss_from_hidden` goes one step further for losses that are a sum over tokens: it
forms the gradient while the chunk's logits are at hand (as Liger's fused linear cross-entropy
does), so backward has nothing to recompute.

Over 400 lines because the two kernels share their chunking and custom-autograd plumbing, and each
forward sits beside its hand-written backward so they can be read (and checked) together.
"""

import torch

from credo.algos.kept_set import mask_outside_kept_

__all__ = ["fused_policy_loss_from_hidden", "logprobs_from_hidden"]


def _compute_dtype(dtype):
    """The softmax math runs in fp32 for fp32/bf16/fp16 inputs and in fp64 for fp64 ones (gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# log-probs below this are exp()-ed to exactly 0 in fp32 and fp64, so clamping to it changes no result while
# keeping 0 * (-inf) = NaN out of the entropy when a bias masks vocabulary entries with -inf (without a
# bias, finite inputs give finite logits and the clamp is skipped).
_LOGP_FLOOR = -1.0e4


def _chunk_logits(hidden_chunk, weight, bias, temperature, out):
    """Writes z = (hidden_chunk @ weight.T + bias) / temperature into `out` ([rows, V], fp32 or fp64)."""
    # 1/T rides on the GEMM's alpha/beta, saving a pass over the [rows, V] buffer.
    scale = 1.0 / temperature
    if hidden_chunk.dtype == out.dtype:
        if bias is None:
            out.addmm_(hidden_chunk, weight.t(), beta=0.0, alpha=scale)  # beta=0: out's old values are ignored
        else:
            torch.addmm(bias, hidden_chunk, weight.t(), beta=scale, alpha=scale, out=out)
    else:
        # The matmul runs in the input dtype as a bf16/fp16 lm_head would; the softmax math runs in fp32.
        logits = torch.mm(hidden_chunk, weight.t()) if bias is None else torch.addmm(bias, hidden_chunk, weight.t())
        out.copy_(logits)
        del logits
        if temperature != 1.0:
            out.mul_(scale)
    return out


def _row_dot(x, y):
    """sum_j x[i, j] * y[i, j] for [rows, V] tensors, without a [rows, V] temporary."""
    return torch.bmm(x.unsqueeze(1), y.unsqueeze(2)).view(-1)


def _softmax_stats_(z, labels, p_out, *, normalize=False, floor=True):
    """From z [rows, V], returns (log p_y, logsumexp, entropy or None).

    Works in place. With `p_out`: z ends as log p (floored at _LOGP_FLOOR if `floor`, needed only
    when a bias can hold -inf), p_out as p if `normalize` (else unnormalised exp(z - max)), and the
    entropy is computed. Without: z ends as p if `normalize` (else exp(z - max)), no entropy.
    """
    label_logit = z.gather(1, labels[:, None]).squeeze(1)
    row_max = z.amax(dim=1, keepdim=True)
    z.sub_(row_max)
    entropy = None
    if p_out is None:
        sum_exp = z.exp_().sum(dim=1, keepdim=True)
        if normalize:
            z.div_(sum_exp)
    else:
        sum_exp = torch.exp(z, out=p_out).sum(dim=1, keepdim=True)
        z.sub_(sum_exp.log())
        if floor:
            z.clamp_(min=_LOGP_FLOOR)
        # H = -sum_j p_j log p_j = -(sum_j e_j log p_j) / sum_j e_j with e = exp(z - max)
        entropy = -_row_dot(p_out, z) / sum_exp.squeeze(1)
        if normalize:
            p_out.div_(sum_exp)
    lse = (row_max + sum_exp.log()).squeeze(1)
    return label_logit - lse, lse, entropy


def _logit_grad_(log_p, p, labels, a, b, entropy):
    """dL/dz for L = sum_i a_i log p_i(y_i) + b_i H_i, written over `log_p` (or `p` when b is None).

        d log p_y / dz = onehot(y) - p,    dH / dz = -p * (z - sum_j p_j z_j) = -p * (log p + H).
    """
    if b is None:
        g = p.mul_(-a[:, None])
    else:
        # -p * (a + b (log p + H)) = p * (-b log p - (a + b H)), in three passes over [rows, V]
        shift = b * entropy if a is None else torch.addcmul(a, b, entropy)
        g = log_p.mul_(-b[:, None]).sub_(shift[:, None]).mul_(p)
    if a is not None:
        g.scatter_add_(1, labels[:, None], a[:, None])
    return g


def _accumulate_grads(g, hidden_chunk, weight, grad_hidden_chunk, grad_weight, grad_bias):
    """d_hidden[chunk] = G @ W, d_weight += G.T @ hidden[chunk], d_bias += sum_rows G (G = dL/dlogits)."""
    if grad_bias is not None:
        grad_bias += g.sum(dim=0)
    g = g.to(weight.dtype)
    if grad_hidden_chunk is not None:
        torch.mm(g, weight, out=grad_hidden_chunk)
    if grad_weight is not None:
        if grad_weight.dtype == g.dtype:
            grad_weight.addmm_(g.t(), hidden_chunk)
        else:  # bf16/fp16 product, accumulated over chunks in fp32
            grad_weight += g.t() @ hidden_chunk


def _grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias):
    dtype = _compute_dtype(hidden.dtype)
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_bias else None
    return grad_hidden, grad_weight, grad_bias


def _cast_grads(grad_weight, grad_bias, weight, bias):
    grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
    grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
    return grad_weight, grad_bias


class _LogProbsFromHidden(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy, kept):
        n, vocab = hidden.shape[0], weight.shape[0]
        rows_per_chunk = max(1, min(chunk_size, n))
        dtype = _compute_dtype(hidden.dtype)
        z = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype)
        p = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype) if with_entropy else None
        logp = hidden.new_empty((n,), dtype=dtype)
        lse = hidden.new_empty((n,), dtype=dtype)
        entropy = hidden.new_empty((n,), dtype=dtype) if with_entropy else None
        for start in range(0, n, rows_per_chunk):
            stop = min(start + rows_per_chunk, n)
            zc = _chunk_logits(hidden[start:stop], weight, bias, temperature, z[: stop - start])
            if kept is not None:  # renormalise over the sampler's kept set (credo.algos.kept_set)
                mask_outside_kept_(zc, kept[start:stop], labels[start:stop])
            pc = p[: stop - start] if with_entropy else None
            logp[start:stop], lse[start:stop], ent = _softmax_stats_(
                zc, labels[start:stop], pc, floor=bias is not None or kept is not None
            )
            if with_entropy:
                entropy[start:stop] = ent
        del z, p
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy, kept)
        ctx.temperature = temperature
        ctx.rows_per_chunk = rows_per_chunk
        ctx.set_materialize_grads(False)
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_entropy=None):
        hidden, weight, bias, labels, lse, entropy, kept = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if (grad_logp is None and grad_entropy is None) or not (need_hidden or need_weight or need_bias):
            return None, None, None, None, None, None, None, None
        temperature, rows_per_chunk = ctx.temperature, ctx.rows_per_chunk
        n, vocab = hidden.shape[0], weight.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        # dz/dlogits = 1 / T, folded into the per-row upstream scalars.
        a = grad_logp.to(dtype) / temperature if grad_logp is not None else None
        b = grad_entropy.to(dtype) / temperature if grad_entropy is not None else None
        grad_hidden, grad_weight, grad_bias = _grad_buffers(hidden, weight, bias, need_hidden, need_weight, need_bias)
        z = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype)
        p = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype) if b is not None else None
        for start in range(0, n, rows_per_chunk):
            stop = min(start + rows_per_chunk, n)
            rows = slice(start, stop)
            log_p = _chunk_logits(hidden[rows], weight, bias, temperature, z[: stop - start])
            if kept is not None:  # the same kept set as forward: tokens outside it get p = 0 and no gradient
                mask_outside_kept_(log_p, kept[rows], labels[rows])
            log_p.sub_(lse[rows, None])
            if b is None:
                pc = log_p.exp_()  # one buffer: the entropy term is absent
            else:
                if bias is not None or kept is not None:
                    log_p.clamp_(min=_LOGP_FLOOR)
                pc = torch.exp(log_p, out=p[: stop - start])
            g = _logit_grad_(
                log_p, pc, labels[rows], a[rows] if a is not None else None, b[rows] if b is not None else None,
                entropy[rows] if b is not None else None,
            )  # fmt: skip
            _accumulate_grads(
                g, hidden[rows], weight, grad_hidden[rows] if need_hidden else None, grad_weight, grad_bias
            )
        grad_weight, grad_bias = _cast_grads(grad_weight, grad_bias, weight, bias)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    bias: torch.Tensor | None = None,
    kept_threshold: torch.Tensor | None = None,
):
    """Log-probs (and entropy) of `labels` under softmax((hidden @ weight.T + bias) / temperature), chunked.

    Equivalent to ``torch.log_softmax((hidden @ weight.T + bias) / T, -1).gather(-1, labels[..., None])``
    but never holds the full [N, V] logits: rows are processed `chunk_size` at a time, forward keeps
    only the per-row logsumexp (and entropy), and backward recomputes each chunk's logits to form

        d log p_y / dz = onehot(y) - p,        dH / dz = -p * (z - sum_j p_j z_j),    z = logits / T,

    accumulating ``d_hidden[chunk] = G @ W`` and ``d_weight += G.T @ hidden[chunk]`` (G = dL/dlogits).
    Chunked log-softmax as in Liger Kernel (arXiv:2410.10989) and Cut Cross-Entropy (arXiv:2411.09009).

    Peak extra memory is one fp32 [chunk_size, V] buffer (two when the entropy is computed in
    forward or receives a gradient in backward), plus the weight gradient (accumulated in fp32 when
    the weight is bf16/fp16). Double backward is not supported.

    Args:
        hidden: final hidden states, shape [..., H], float32/bfloat16/float16 (float64 for gradcheck).
        weight: output-embedding (lm_head) matrix, shape [V, H], same dtype and device as `hidden`.
        labels: token ids, shape [...] (hidden.shape[:-1]), int64, each in [0, V).
        temperature: sampling temperature T > 0; logits are divided by it before the softmax.
        chunk_size: rows per chunk; smaller uses less memory, larger keeps the matmuls efficient.
        with_entropy: also return the entropy of the full (temperature-scaled) distribution.
        bias: optional lm_head bias, shape [V], same dtype as `weight`.
        kept_threshold: optional, shape [...] like `labels`: each row's kept-set threshold tau of a truncated
            sampler (`credo.algos.kept_set`); the softmax (log-probs, entropy, gradient) is then taken over
            K = {j : z_j - max z >= tau} plus the label, a row with tau = -inf over the whole vocabulary.

    Returns:
        log_probs, shape [...], float32; or ``(log_probs, entropy)``, both [...] float32, when
        `with_entropy`. Outputs are float32 for float32/bfloat16/float16 inputs (the softmax runs in
        float32 on logits computed by a matmul in the input dtype) and float64 for float64 inputs;
        gradients come back in the dtypes of `hidden`, `weight` and `bias`.

    Raises:
        ValueError: on a shape, dtype or device mismatch, labels out of [0, V), temperature <= 0 or
            chunk_size < 1.
    """
    _check_inputs(hidden, weight, labels, bias, temperature, chunk_size)
    if kept_threshold is not None:
        if not isinstance(kept_threshold, torch.Tensor) or kept_threshold.shape != labels.shape:
            shape = list(kept_threshold.shape) if isinstance(kept_threshold, torch.Tensor) else type(kept_threshold)
            raise ValueError(f"kept_threshold has shape {shape}, expected {list(labels.shape)} like labels")
        kept_threshold = kept_threshold.detach().reshape(-1).to(device=hidden.device, dtype=torch.float32)
    lead_shape = hidden.shape[:-1]
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])
    labels_1d = labels.reshape(-1)
    out = _LogProbsFromHidden.apply(
        hidden_2d, weight, bias, labels_1d, float(temperature), int(chunk_size), bool(with_entropy), kept_threshold
    )
    if with_entropy:
        log_probs, entropy = out
        return log_probs.reshape(lead_shape), entropy.reshape(lead_shape)
    return out.reshape(lead_shape)


class _FusedTokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, token_loss, token_inputs, temperature, chunk_size, with_entropy,
                needs):  # fmt: skip
        n, vocab = hidden.shape[0], weight.shape[0]
        rows_per_chunk = max(1, min(chunk_size, n))
        dtype = _compute_dtype(hidden.dtype)
        need_hidden, need_weight, need_bias = needs
        grad_hidden, grad_weight, grad_bias = _grad_buffers(hidden, weight, bias, False, need_weight, need_bias)
        if need_hidden:  # zeros: rows whose loss ignores them get no contribution
            grad_hidden = torch.zeros_like(hidden)
        z = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype)
        p = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype) if with_entropy else None
        logp = hidden.new_empty((n,), dtype=dtype)
        entropy = hidden.new_empty((n,), dtype=dtype) if with_entropy else None
        loss = torch.zeros((), dtype=dtype, device=hidden.device)
        for start in range(0, n, rows_per_chunk):
            stop = min(start + rows_per_chunk, n)
            rows = slice(start, stop)
            zc = _chunk_logits(hidden[rows], weight, bias, temperature, z[: stop - start])
            pc = p[: stop - start] if with_entropy else None
            logp[rows], _, ent = _softmax_stats_(zc, labels[rows], pc, normalize=True, floor=bias is not None)
            if with_entropy:
                entropy[rows] = ent
            else:
                pc = zc
            with torch.enable_grad():
                lp_leaf = logp[rows].detach().requires_grad_()
                ent_leaf = entropy[rows].detach().requires_grad_() if with_entropy else None
                chunk_loss = token_loss(lp_leaf, ent_leaf, *(t[rows] for t in token_inputs)).sum()
                leaves = [lp_leaf] + ([ent_leaf] if with_entropy else [])
                grads = torch.autograd.grad(chunk_loss, leaves, allow_unused=True) if chunk_loss.requires_grad else []
            loss += chunk_loss.detach().to(dtype)
            a = grads[0].to(dtype) / temperature if len(grads) > 0 and grads[0] is not None else None
            b = grads[1].to(dtype) / temperature if len(grads) > 1 and grads[1] is not None else None
            if (a is None and b is None) or not any(needs):
                continue
            g = _logit_grad_(zc, pc, labels[rows], a, b, ent)
            _accumulate_grads(
                g, hidden[rows], weight, grad_hidden[rows] if need_hidden else None, grad_weight, grad_bias
            )
        del z, p
        grad_weight, grad_bias = _cast_grads(grad_weight, grad_bias, weight, bias)
        # Held on ctx rather than saved: backward scales them in place and lets them go.
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(logp, *([entropy] if with_entropy else []))
        if with_entropy:
            return loss, logp, entropy
        return loss, logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *unused):
        if ctx.grads is None:
            raise RuntimeError("fused_policy_loss_from_hidden supports one backward per forward")
        grads, ctx.grads = ctx.grads, None
        if grad_loss is None:
            return (None,) * 10
        for grad in grads:
            if grad is not None:
                grad.mul_(grad_loss.to(grad.dtype))
        return (*grads,) + (None,) * 7


def fused_policy_loss_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    token_loss,
    *,
    token_inputs: tuple[torch.Tensor, ...] = (),
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    bias: torch.Tensor | None = None,
):
    """A token-separable loss of the log-probs (and entropy), with its gradient formed chunk by chunk.

    For a loss that is a sum over tokens, ``L = sum_i token_loss(log p_i(y_i), H_i, inputs_i)``
    (token-mean with a global token count, PPO/GRPO/CISPO clipping, k3 KL to a reference, an
    entropy bonus), the per-token upstream gradients dL/dlog p_i and dL/dH_i are known as soon
    as a chunk's log-probs are. So the forward pass computes each chunk's logits once, calls
    `token_loss` on the chunk, forms dL/dlogits (see `logprobs_from_hidden`) and accumulates
    d_hidden, d_weight and d_bias right away, as Liger Kernel's fused linear cross-entropy does
    (arXiv:2410.10989). Backward only scales the stored gradients by the upstream scalar: three
    matmuls per chunk in all instead of four for forward + recompute.

    The gradients are held from forward until backward (d_weight is [V, H], as its .grad would be
    anyway), which scales them in place and releases them: one backward per forward, no double
    backward, and `token_inputs` are treated as constants (no gradient flows to them).

    Args:
        hidden: final hidden states, shape [..., H], float32/bfloat16/float16 (float64 for tests).
        weight: lm_head matrix, shape [V, H], same dtype and device as `hidden`.
        labels: token ids, shape [...] (hidden.shape[:-1]), int64, each in [0, V).
        token_loss: ``token_loss(log_probs [rows], entropy [rows] or None, *inputs [rows]) -> tensor``
            whose sum is these rows' contribution to the loss. It is called once per chunk, on
            float32 log-probs/entropy; it must treat rows independently (fold any normaliser, such
            as a global token count, into `token_inputs` or the closure).
        token_inputs: per-token tensors shaped like `labels` (old log-probs, advantages, mask
            weights, ...); each is flattened and sliced to the chunk's rows for `token_loss`.
        temperature: sampling temperature T > 0.
        chunk_size: rows per chunk.
        with_entropy: compute the entropy and pass it to `token_loss` (else it receives None).
        bias: optional lm_head bias, shape [V].

    Returns:
        ``(loss, log_probs, entropy)``: the scalar loss (float32; differentiable w.r.t. hidden,
        weight and bias), and detached float32 log-probs and entropy shaped [...] for metrics
        (entropy is None unless `with_entropy`).

    Raises:
        ValueError: as `logprobs_from_hidden`, and when a token input's shape or device differs
            from `labels`.
    """
    _check_inputs(hidden, weight, labels, bias, temperature, chunk_size)
    token_inputs = tuple(token_inputs)
    for i, t in enumerate(token_inputs):
        if not isinstance(t, torch.Tensor) or t.shape != labels.shape:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"token_inputs[{i}] has shape {shape}, expected {list(labels.shape)} like labels")
        if t.device != labels.device:
            raise ValueError(f"token_inputs[{i}] is on {t.device}, expected {labels.device} like labels")
    lead_shape = hidden.shape[:-1]
    grad_on = torch.is_grad_enabled()
    needs = tuple(grad_on and t is not None and t.requires_grad for t in (hidden, weight, bias))
    out = _FusedTokenLoss.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, labels.reshape(-1), token_loss,
        tuple(t.detach().reshape(-1) for t in token_inputs), float(temperature), int(chunk_size),
        bool(with_entropy), needs,
    )  # fmt: skip
    loss, log_probs = out[0], out[1].reshape(lead_shape)
    entropy = out[2].reshape(lead_shape) if with_entropy else None
    return loss, log_probs, entropy


def _check_inputs(hidden, weight, labels, bias, temperature, chunk_size):
    floating = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    if hidden.dim() < 1:
        raise ValueError(f"hidden has shape {list(hidden.shape)}, expected [..., H]")
    if hidden.dtype not in floating:
        raise ValueError(f"hidden has dtype {hidden.dtype}, expected one of float32, bfloat16, float16, float64")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight has shape {list(weight.shape)}, expected [V, {hidden.shape[-1]}] to match hidden's last dim"
        )
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight has dtype {weight.dtype}, expected {hidden.dtype} like hidden")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device}, expected {hidden.device} like hidden")
    if labels.dtype != torch.int64:
        raise ValueError(f"labels has dtype {labels.dtype}, expected torch.int64")
    if labels.shape != hidden.shape[:-1]:
        expected = list(hidden.shape[:-1])
        raise ValueError(f"labels has shape {list(labels.shape)}, expected {expected} like hidden[..., 0]")
    if labels.device != hidden.device:
        raise ValueError(f"labels is on {labels.device}, expected {hidden.device} like hidden")
    if bias is not None:
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias has shape {list(bias.shape)}, expected [{weight.shape[0]}] like weight's rows")
        if bias.dtype != weight.dtype:
            raise ValueError(f"bias has dtype {bias.dtype}, expected {weight.dtype} like weight")
        if bias.device != weight.device:
            raise ValueError(f"bias is on {bias.device}, expected {weight.device} like weight")
    if not temperature > 0:
        raise ValueError(f"temperature is {temperature}, expected > 0")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size is {chunk_size!r}, expected a positive int")
    if labels.numel() > 0:
        vocab = weight.shape[0]
        bad = (labels < 0) | (labels >= vocab)
        if bool(bad.any()):
            first = labels[bad][0].item()
            raise ValueError(f"labels contains {first}, expected every label in [0, {vocab})")
