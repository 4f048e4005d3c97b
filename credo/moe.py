"""Mixture-of-experts routing: find a model's routers, record the experts each token went to during rollout, and
replay recorded routing in a trainer forward (Rollout Routing Replay, R3: arXiv 2510.11370; docs/moe.md).

A router is the top-k router module of a transformers sparse MoE block (`model.layers[i].mlp.gate`):

    router(hidden [N, d]) -> (router_logits [N, E], gate_weights [N, k], experts [N, k])
    gate_weights = softmax(router_logits)[experts], renormalised to sum 1 when `norm_topk_prob`

N counts the forward's tokens row-major over its [B, S] input. Routing is kept as `[positions, n_layers, k]` integer
expert ids, -1 where nothing was recorded (such a position routes itself).

    routers(model)                        the routers, in layer order ([] for a dense model)
    RoutingRecorder(model)                forward hooks that keep every call's experts (hf rollout capture)
    route(model, experts, replay, counts) the routers, for one forward, replay `experts` (or only compare with them)

Replay keeps the gradient R3 keeps: the chosen experts come from the record, their weights are still
softmax(W_r h) gathered at those experts and renormalised as the model does, so the router's weight W_r is trained.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

ROUTER_CLASSES = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter")
"""transformers router classes whose forward is softmax -> top-k -> renormalise if `norm_topk_prob` -> cast to the
logits' dtype, the computation `route` reproduces (tested on Qwen3-MoE; the other two share its code line for
line in transformers 5.19). Mixtral's differs (jitter noise, always renormalised, no cast) and is not listed."""


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in module order (= layer order), [] when it has none. A LoRA/PEFT wrapper is looked
    through (named_modules walks it)."""
    return [m for m in model.modules() if type(m).__name__ in ROUTER_CLASSES]


def routing_shape(model: torch.nn.Module) -> tuple[int, int] | None:
    """(n_layers with a router, top_k) of the model, or None for a dense model."""
    found = routers(model)
    return (len(found), int(found[0].top_k)) if found else None


class RoutingRecorder:
    """Forward hooks on every router that keep the experts each call chose (`experts [N, k]`), per layer, in call order.

    Used around transformers `generate`: call 0 is the prefill over the left-padded prompts [B, W], each later call
    one decoding step [B, 1]. `per_position()` stacks them into [B, W + steps, n_layers, k].
    """

    def __init__(self, model: torch.nn.Module):
        self.routers = routers(model)
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self._handles: list = []

    def __enter__(self) -> "RoutingRecorder":
        for layer, router in enumerate(self.routers):
            def keep(module, args, output, layer=layer):
                self.calls[layer].append(output[2].detach().to("cpu", torch.int16))
            self._handles.append(router.register_forward_hook(keep))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def per_position(self, batch: int) -> torch.Tensor:
        """[batch, positions, n_layers, k] int16: the experts of every position each call ran, calls in order."""
        layers = [torch.cat([c.view(batch, -1, c.shape[-1]) for c in calls], 1) for calls in self.calls]
        return torch.stack(layers, 2)


def sample_routing(per_position: torch.Tensor, pad: list[int], prompt_lens: list[int],
                   lengths: list[int]) -> list[torch.Tensor]:
    """Each generated row's routing over its own positions: its prompt's tokens, then every response token but the
    last (the last is never fed back: no forward routed it, and no scored log-prob depends on it).

    Args:
        per_position: [B, W + steps, n_layers, k] from `RoutingRecorder.per_position` (W the padded prompt width).
        pad: [B] left padding of each prompt. prompt_lens: [B]. lengths: [B] response tokens kept.
    Returns:
        B tensors [prompt_len + max(length - 1, 0), n_layers, k] int16: position j is the input position j of the
        sample's prompt + response, as the trainer's forward sees it.
    """
    return [per_position[i, p0:p0 + p + max(n - 1, 0)].clone()
            for i, (p0, p, n) in enumerate(zip(pad, prompt_lens, lengths))]


def pack_routing(records: list[torch.Tensor | None], width: int, shape: tuple[int, int]) -> torch.Tensor:
    """[B, width - 1, n_layers, k] int16 label-aligned routing (column j = input position j, the position that scores
    token j + 1), -1 where a sample recorded nothing. `records[i]` covers sample i's first positions."""
    out = torch.full((len(records), width - 1, *shape), -1, dtype=torch.int16)
    for i, rec in enumerate(records):
        if rec is not None and rec.numel():
            if tuple(rec.shape[1:]) != tuple(shape):
                raise ValueError(f"sample {i}: routed_experts has shape {list(rec.shape)}, expected [positions, "
                                 f"{shape[0]}, {shape[1]}] (n_layers, top_k) like the other samples")
            n = min(rec.shape[0], width - 1)
            out[i, :n] = rec[:n]
    return out


@dataclass
class RoutingCounts:
    """Running counts over recorded (token, layer) slots: `used`, those whose experts the forward ran differ from the
    recorded ones (0 under replay); `own`, those whose router's own top-k differs from them (the disagreement replay
    removes). Compared as sets of k experts: their order does not change the block's output."""

    used: int = 0
    own: int = 0
    slots: int = 0

    def compare(self, own: torch.Tensor, used: torch.Tensor, recorded: torch.Tensor, has: torch.Tensor) -> None:
        """own, used, recorded: [N, k] experts; has: [N] bool, the rows that were recorded."""
        target = recorded.sort(-1).values
        self.own += int(((own.sort(-1).values != target).any(-1) & has).sum())
        self.used += int(((used.sort(-1).values != target).any(-1) & has).sum())
        self.slots += int(has.sum())


def _select(router, hidden: torch.Tensor, recorded: torch.Tensor, replay: bool, counts: RoutingCounts | None,
            layer: int):
    """The router's forward with recorded experts `recorded [N, k]` (-1 rows: the router's own choice)."""
    hidden = hidden.reshape(-1, router.hidden_dim)
    if recorded.shape[0] != hidden.shape[0] or recorded.shape[1] != router.top_k:
        raise ValueError(f"recorded routing has shape {list(recorded.shape)} for layer {layer}, expected "
                         f"[{hidden.shape[0]}, {router.top_k}] (the forward's tokens, top_k)")
    recorded = recorded.to(hidden.device, torch.long)
    has = recorded[:, 0] >= 0
    if not replay:  # the class's own forward: the block's outputs are bitwise those of a forward without `route`
        out = type(router).forward(router, hidden)
        if counts is not None:
            counts.compare(out[2], out[2], recorded, has)
        return out
    logits = torch.nn.functional.linear(hidden, router.weight)
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    own = torch.topk(probs, router.top_k, dim=-1).indices
    chosen = torch.where(has[:, None], recorded, own)
    if counts is not None:
        counts.compare(own, chosen, recorded, has)
    values = probs.gather(-1, chosen)  # differentiable in the router's weight through the softmax
    if router.norm_topk_prob:
        values = values / values.sum(-1, keepdim=True)
    return logits, values.to(logits.dtype), chosen


@contextlib.contextmanager
def route(model: torch.nn.Module, experts: torch.Tensor, *, replay: bool, counts: RoutingCounts | None = None):
    """Within the block, each router of `model` sees recorded experts for the forward's tokens.

    Args:
        experts: [N, n_layers, k] integer, the recorded experts of the forward's N tokens (row-major over its
            [B, S] input), -1 where none was recorded.
        replay: True: route through the recorded experts (R3); False: route as the model does (its outputs are the
            same values as without this block) and only compare.
        counts: accumulates the (token, layer) slots whose routed (and own top-k) set differs from the recorded one.
    Raises:
        ValueError: the model has no router, or `experts` does not match its layers, top-k or a forward's tokens.

    Not for gradient checkpointing: a recompute in the backward would run outside the block (the recipe refuses it).
    """
    found = routers(model)
    if not found:
        raise ValueError("route: the model has no MoE router (expected a transformers sparse MoE model: "
                         f"{', '.join(ROUTER_CLASSES)})")
    if experts.dim() != 3 or experts.shape[1] != len(found):
        raise ValueError(f"recorded routing has shape {list(experts.shape)}, expected [tokens, {len(found)}, top_k] "
                         "(one entry per MoE layer)")
    for layer, router in enumerate(found):
        def forward(hidden, layer=layer, router=router):
            return _select(router, hidden, experts[:, layer], replay, counts, layer)
        router.forward = forward  # an instance attribute shadows the class's forward
    try:
        yield counts
    finally:
        for router in found:
            router.__dict__.pop("forward", None)


@dataclass
class ForwardRouting:
    """The recorded routing of a trainer forward's rows, and what to do with it (`credo.train.scoring`)."""

    experts: torch.Tensor
    """[B, T, n_layers, k] integer, label-aligned like the batch's [B, T] fields: column j is input position j; -1
    where nothing was recorded (`credo.train.batch.Batch.routed_experts`)."""
    replay: bool
    """Route through the recorded experts (algo.router_replay) or only compare."""
    counts: RoutingCounts | None = None
    """Where this forward's disagreement is counted (None: not counted)."""

    def rows(self, index: torch.Tensor) -> "ForwardRouting":
        return ForwardRouting(self.experts[index], self.replay, self.counts)

    def padded(self, length: int, prefix: int = 0) -> torch.Tensor:
        """[B * (prefix + length), n_layers, k]: the experts of a padded forward over `prefix` soft-prefix positions
        (unrecorded) and `length` input positions, row-major."""
        B, T = self.experts.shape[:2]
        out = self.experts.new_full((B, prefix + length, *self.experts.shape[2:]), -1)
        n = min(T, length)
        out[:, prefix:prefix + n] = self.experts[:, :n]
        return out.flatten(0, 1)

    def packed(self, starts: torch.Tensor, lengths: list[int], total: int) -> torch.Tensor:
        """[total, n_layers, k]: the experts of a packed forward whose sample b starts at flat position starts[b]."""
        out = self.experts.new_full((total, *self.experts.shape[2:]), -1)
        for b, (start, n) in enumerate(zip(starts.tolist(), lengths)):
            n = min(n, self.experts.shape[1])
            out[start:start + n] = self.experts[b, :n]
        return out


def routing_or_none(model: torch.nn.Module, routing: ForwardRouting | None, experts: torch.Tensor | None):
    """`route(model, experts, ...)` when there is routing to apply, else a no-op context."""
    if routing is None:
        return contextlib.nullcontext()
    return route(model, experts, replay=routing.replay, counts=routing.counts)
