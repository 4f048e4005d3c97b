"""Token-by-token reference for log-probs and entropy from hidden states, shared by the tests here."""

import math

import torch


def reference_logprobs_and_entropy(hidden, weight, labels, temperature=1.0, bias=None):
    """Token by token, the way the definition reads: z = (W h + b) / T, log p_y, H = -sum p log p."""
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1).tolist()
    log_probs, entropies = [], []
    for row, label in enumerate(flat_labels):
        z = weight @ flat_hidden[row]
        if bias is not None:
            z = z + bias
        z = z / temperature
        log_p = z - torch.logsumexp(z, dim=0)
        log_probs.append(log_p[label])
        p = torch.exp(log_p)
        entropies.append(-torch.sum(torch.where(p > 0, p * log_p, torch.zeros_like(p))))
    return torch.stack(log_probs).reshape(labels.shape), torch.stack(entropies).reshape(labels.shape)


def make_inputs(lead_shape, hidden_size, vocab, dtype=torch.float32, seed=0, with_bias=False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*lead_shape, hidden_size, generator=gen, dtype=torch.float64)
    weight = torch.randn(vocab, hidden_size, generator=gen, dtype=torch.float64) * 2 / math.sqrt(hidden_size)
    bias = torch.randn(vocab, generator=gen, dtype=torch.float64) if with_bias else None
    labels = torch.randint(0, vocab, lead_shape, generator=gen)
    hidden, weight = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
    if bias is not None:
        bias = bias.to(dtype).requires_grad_()
    return hidden, weight, labels, bias


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None], retain_graph=True)
