"""Token log-probs and entropy from final hidden states without materialising [N, V] logits.

For a sampled token y with hidden state h, the policy log-prob and entropy are

    z = (h @ W.T + b) / T,    log p(y) = z_y - logsumexp(z),    H = logsumexp(z) - sum_j p_j z_j.

With vocabularies of 150k tokens the [N, V] logits (and the autograd buffers around them) dominate
training memory. Following the chunked-loss idea of Liger Kernel (arXiv:2410.10989) and Cut
Cross-Entropy (arXiv:2411.09009), `logprobs_from_hidden` processes rows in chunks, keeps only O(N)
statistics (logsumexp and entropy) for backward, and recomputes each chunk's logits there.
"""

import torch

__all__ = ["logprobs_from_hidden"]

def _compute_dtype(dtype):
    """The softmax math runs in fp32 for fp32/bf16/fp16 inputs and in fp64 for fp64 ones (gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# log-probs below this are exp()-ed to exactly 0 in fp32, so clamping to it changes no result while
# keeping 0 * (-inf) = NaN out of the entropy when a bias masks vocabulary entries with -inf.
_LOGP_FLOOR = -1.0e4


def _chunk_logits(hidden_chunk, weight, bias, temperature, out):
    """Writes z = (hidden_chunk @ weight.T + bias) / temperature into `out` ([rows, V], fp32 or fp64)."""
    if hidden_chunk.dtype == out.dtype:
        if bias is None:
            torch.mm(hidden_chunk, weight.t(), out=out)
        else:
            torch.addmm(bias, hidden_chunk, weight.t(), out=out)
    else:
        # The matmul runs in the input dtype as a bf16/fp16 lm_head would; the softmax math runs in fp32.
        logits = torch.mm(hidden_chunk, weight.t()) if bias is None else torch.addmm(bias, hidden_chunk, weight.t())
        out.copy_(logits)
        del logits
    if temperature != 1.0:
        out.div_(temperature)
    return out


class _LogProbsFromHidden(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        rows_per_chunk = max(1, min(chunk_size, n))
        vocab = weight.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        z = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype)
        p = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype) if with_entropy else None
        logp = hidden.new_empty((n,), dtype=dtype)
        lse = hidden.new_empty((n,), dtype=dtype)
        entropy = hidden.new_empty((n,), dtype=dtype) if with_entropy else None
        for start in range(0, n, rows_per_chunk):
            stop = min(start + rows_per_chunk, n)
            zc = _chunk_logits(hidden[start:stop], weight, bias, temperature, z[: stop - start])
            label_logit = zc.gather(1, labels[start:stop, None]).squeeze(1)
            row_max = zc.amax(dim=1, keepdim=True)
            zc.sub_(row_max)
            if with_entropy:
                pc = torch.exp(zc, out=p[: stop - start])
                sum_exp = pc.sum(dim=1, keepdim=True)
                zc.sub_(sum_exp.log()).clamp_(min=_LOGP_FLOOR)  # zc now holds log p
                pc.div_(sum_exp)
                entropy[start:stop] = -(pc.mul_(zc)).sum(dim=1)
            else:
                sum_exp = zc.exp_().sum(dim=1, keepdim=True)
            lse[start:stop] = (row_max + sum_exp.log()).squeeze(1)
            logp[start:stop] = label_logit - lse[start:stop]
        del z, p
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.rows_per_chunk = rows_per_chunk
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_entropy=None):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if (grad_logp is None and grad_entropy is None) or not (need_hidden or need_weight or need_bias):
            return None, None, None, None, None, None, None
        temperature, rows_per_chunk = ctx.temperature, ctx.rows_per_chunk
        n, vocab = hidden.shape[0], weight.shape[0]
        # dz/d(logits) = 1 / T, folded into the per-row upstream scalars.
        dtype = _compute_dtype(hidden.dtype)
        a = grad_logp.to(dtype) / temperature if grad_logp is not None else None
        b = grad_entropy.to(dtype) / temperature if grad_entropy is not None else None

        low_precision = weight.dtype != dtype
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros((vocab,), dtype=dtype, device=weight.device) if need_bias else None
        z = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype)
        p = hidden.new_empty((rows_per_chunk, vocab), dtype=dtype) if b is not None else None
        for start in range(0, n, rows_per_chunk):
            stop = min(start + rows_per_chunk, n)
            hc = hidden[start:stop]
            g = _chunk_logits(hc, weight, bias, temperature, z[: stop - start])
            g.sub_(lse[start:stop, None])  # log p
            if b is None:
                # d log p_y / dz = onehot(y) - p
                g.exp_().mul_(-a[start:stop, None])
            else:
                # dH/dz = -p * (z - sum_j p_j z_j) = -p * (log p + H)
                g.clamp_(min=_LOGP_FLOOR)
                pc = torch.exp(g, out=p[: stop - start])
                g.add_(entropy[start:stop, None]).mul_(b[start:stop, None])
                if a is not None:
                    g.add_(a[start:stop, None])
                g.mul_(pc).neg_()
            if a is not None:
                g.scatter_add_(1, labels[start:stop, None], a[start:stop, None])
            if need_bias:
                grad_bias += g.sum(dim=0)
            g_in = g.to(weight.dtype) if low_precision else g
            if need_hidden:
                torch.mm(g_in, weight, out=grad_hidden[start:stop])
            if need_weight:
                if low_precision:
                    grad_weight += g_in.t() @ hc
                else:
                    grad_weight.addmm_(g_in.t(), hc)
            del g_in
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    bias: torch.Tensor | None = None,
):
    """Log-probs (and entropy) of `labels` under softmax((hidden @ weight.T + bias) / temperature), chunked.

    Equivalent to ``torch.log_softmax((hidden @ weight.T + bias) / T, -1).gather(-1, labels[..., None])``
    but never holds the full [N, V] logits: rows are processed `chunk_size` at a time, forward keeps
    only the per-row logsumexp (and entropy), and backward recomputes each chunk's logits to form

        d log p_y / dz = onehot(y) - p,        dH / dz = -p * (z - sum_j p_j z_j),    z = logits / T,

    accumulating ``d_hidden[chunk] = G @ W`` and ``d_weight += G.T @ hidden[chunk]`` (G = dL/dlogits).
    Chunked log-softmax as in Liger Kernel (arXiv:2410.10989) and Cut Cross-Entropy (arXiv:2411.09009).

    Peak extra memory is about 2 * chunk_size * V * 4 bytes (one fp32 buffer when `with_entropy` is
    False in forward) plus the fp32 weight-gradient accumulator when the weight is bf16/fp16.
    Double backward is not supported.

    Args:
        hidden: final hidden states, shape [..., H], float32/bfloat16/float16 (float64 for gradcheck).
        weight: output-embedding (lm_head) matrix, shape [V, H], same dtype and device as `hidden`.
        labels: token ids, shape [...] (hidden.shape[:-1]), int64, each in [0, V).
        temperature: sampling temperature T > 0; logits are divided by it before the softmax.
        chunk_size: rows per chunk; smaller uses less memory, larger keeps the matmuls efficient.
        with_entropy: also return the entropy of the full (temperature-scaled) distribution.
        bias: optional lm_head bias, shape [V], same dtype as `weight`.

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
    lead_shape = hidden.shape[:-1]
    hidden_2d = hidden.reshape(-1, hidden.shape[-1])
    labels_1d = labels.reshape(-1)
    out = _LogProbsFromHidden.apply(
        hidden_2d, weight, bias, labels_1d, float(temperature), int(chunk_size), bool(with_entropy)
    )
    if with_entropy:
        log_probs, entropy = out
        return log_probs.reshape(lead_shape), entropy.reshape(lead_shape)
    return out.reshape(lead_shape)


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
        raise ValueError(f"labels has shape {list(labels.shape)}, expected {list(hidden.shape[:-1])} like hidden[..., 0]")
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
