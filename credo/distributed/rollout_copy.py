"""A rollout copy of the policy at another precision: the induced train/inference mismatch of MIPU.

MIPU (arXiv 2606.29526) samples with an FP8-quantised vLLM engine while the trainer computes in higher
precision; the two then disagree on the log-prob of the same token. On CPU that regime is reproduced
with a second copy of the policy that the HF backend samples from:

- `dtype` (bfloat16 / float16): the copy's weights are cast to that dtype, its forward runs in it;
- `fp8_weights`: every linear layer's weight of the copy is replaced by its simulated e4m3 image with one
  scale per output channel (`credo.distributed.fp8.quantize_e4m3`), as vLLM's per-channel FP8 path does.
  Embeddings, norms and the output head stay unquantised (vLLM's FP8 leaves them so).

`sync_from(model)` copies the trainer's current weights into the copy (quantising on the way); the trainer's
own weights are never written. The same `fp8_state` serves the vLLM backend, whose weights are pushed as a
state dict.
"""

from __future__ import annotations

import copy

import torch

from credo.distributed.engines.weights import engine_of, is_sharded, weight_buckets
from credo.distributed.fp8 import quantize_e4m3
from credo.distributed.weight_sync import unwrap_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def fp8_weight_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of the weights FP8 quantises: every `nn.Linear` weight but the output head's (and any
    weight shared with the input embedding, as a tied head is)."""
    model = unwrap_model(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    skip = {id(m.weight) for m in (head, emb) if m is not None}
    return {f"{name}.weight" if name else "weight" for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head and id(m.weight) not in skip}


def fp8_state(state: dict[str, torch.Tensor], names: set[str]) -> dict[str, torch.Tensor]:
    """`state` with the tensors named in `names` replaced by `quantize_e4m3` of them (channel dim 0, the output
    features of `nn.Linear`); the other tensors are passed through as they are."""
    return {k: quantize_e4m3(v, 0) if k in names else v for k, v in state.items()}


class RolloutCopy:
    """A detached copy of the policy at `dtype`, optionally with simulated FP8 linear weights.

    Args:
        model: the trainer's policy (HF module or a wrapper of one, ZeRO 0-2: full weights on every rank; FSDP2:
            its sharded module, gathered at every sync, a collective every rank joins).
        dtype: 'float32', 'bfloat16', 'float16' or None (the trainer's dtype).
        fp8_weights: quantise the linear weights at every sync.
    """

    def __init__(self, model: torch.nn.Module, *, dtype: str | None, fp8_weights: bool):
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype is {dtype!r}, expected one of {', '.join(DTYPES)} or None")
        src = unwrap_model(model)
        self.sharded = is_sharded(model)
        self.module = (plain_copy(src) if self.sharded else copy.deepcopy(src)).requires_grad_(False).eval()
        for p in self.module.parameters():
            p.grad = None
        if dtype is not None:
            self.module.to(DTYPES[dtype])
        elif self.sharded and engine_of(model).push_dtype is not None:  # the dtype DeepSpeed's module would have
            self.module.to(engine_of(model).push_dtype)
        self.fp8_names = fp8_weight_names(src) if fp8_weights else set()
        self.sync_from(model)

    @torch.no_grad()
    def sync_from(self, model: torch.nn.Module) -> None:
        """Copy the trainer's parameters into the copy (cast to its dtype; FP8-quantised where named)."""
        if self.sharded:  # FSDP2: its engine gathers the DTensor blocks, one bucket of full tensors at a time
            self._sync_gathered(model)
            return
        live = dict(unwrap_model(model).named_parameters())
        for name, p in self.module.named_parameters():
            src = live[name].detach()
            p.copy_(quantize_e4m3(src, 0) if name in self.fp8_names else src)

    def _sync_gathered(self, model: torch.nn.Module) -> None:
        own = dict(self.module.named_parameters())
        done = set()
        for bucket in weight_buckets(model):  # collective: every rank joins each gather
            for name, src in bucket:
                if name not in own:
                    raise KeyError(f"the trainer's weight {name!r} has no parameter in the rollout copy")
                own[name].copy_(quantize_e4m3(src, 0) if name in self.fp8_names else src)
                done.add(name)
        if done != set(own):
            raise KeyError(f"the rollout copy's parameters {sorted(set(own) - done)} got no trainer weight")


def plain_copy(src: torch.nn.Module) -> torch.nn.Module:
    """A new, unsharded instance of `src`'s class and config (FSDP2 shards the blocks, not the top module), its
    weights to be written by `sync_from`. Its random init draws from a forked RNG: the run's own stream (sampling
    seeds, dropout) stays where it was, as a deepcopy leaves it."""
    with torch.random.fork_rng(devices=[]):
        out = type(src)(copy.deepcopy(src.config))
    if getattr(src, "generation_config", None) is not None:
        out.generation_config = copy.deepcopy(src.generation_config)
    return out
