"""A small random Qwen3-MoE and a hand-written forced-gate MoE block, the references of the router replay tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tiny_moe(seed: int = 0, *, layers: int = 2, experts: int = 4, k: int = 2, vocab: int = 128, router_scale: float = 30.0):
    """A random Qwen3-MoE (hidden 32, every block sparse), its routers scaled up so that routing is decisive
    (no near-ties between the k-th and the (k+1)-th expert to flip under float noise)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=experts,
                         num_experts_per_tok=k, moe_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(router_scale)
    return model


def forced_block_forward(block, experts: torch.Tensor):
    """A forward for sparse block `block` that mixes, token by token, the experts `experts [N, k]` with the gate
    weights softmax(W_r h) taken at them and renormalised: the expert MLPs computed from the block's weight tensors
    one token and one expert at a time (no transformers code)."""
    def forward(hidden):
        B, S, d = hidden.shape
        rows = []
        for n, h in enumerate(hidden.reshape(-1, d)):
            p = torch.softmax(block.gate.weight @ h, -1)
            sel = experts[n].long()
            w = p[sel] / p[sel].sum()
            out = torch.zeros_like(h)
            for j, e in enumerate(sel.tolist()):
                gate, up = (block.experts.gate_up_proj[e] @ h).chunk(2)
                out = out + w[j] * (block.experts.down_proj[e] @ (F.silu(gate) * up))
            rows.append(out)
        return torch.stack(rows).view(B, S, d)
    return forward


def own_experts(model, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, L, n_layers, k]: the experts each layer's router picks on a plain forward, from its block's input read by a
    pre-hook and a top-k of softmax(W_r h) computed here."""
    seen = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, args: seen.append((m, args[0])))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in hooks:
            h.remove()
    out = [torch.softmax(h @ m.gate.weight.T, -1).topk(m.gate.top_k, -1).indices for m, h in seen]
    return torch.stack(out, 2)
