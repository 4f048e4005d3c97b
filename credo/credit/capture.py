"""Attention credit captured from a model's own forward pass (arXiv 2510.13554, 2606.10646).

The streaming functions of :mod:`credo.credit.streaming` need each sampled layer's query and key
states after RoPE. This module takes them from a Hugging Face decoder during one ordinary forward
pass (for instance the no-grad log-prob recompute of a training step), without
``output_attentions=True`` and without any ``[L, H, N, N]`` map:

- a forward pre-hook (with kwargs) on each sampled attention module keeps the layer's
  ``position_embeddings = (cos, sin)``;
- a forward hook on its query and key projections (on ``q_norm`` / ``k_norm`` when the class
  normalises heads, as Qwen3 does) takes their output, applies RoPE with the same formula as
  ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin``) and stores the detached states.

Nothing is recomputed, so the capture also works when ZeRO-3 partitions the projections. Extra
memory: the states of the sampled layers, ``O(L * B * (H + H_kv) * N * d)``, a packed copy of one
layer (rhythm) or of all sampled layers (flow), the ``O(L * B * H * N)`` statistics, and
``scores_per_step`` attention scores while :mod:`credo.credit.batched` reduces the whole batch
one block of query rows at a time.

The module imports no ``transformers``: attention modules are recognised by their class name and
attributes (``q_proj``, ``k_proj``, ``head_dim``, ``scaling``, ``config.num_attention_heads``,
``config.num_key_value_heads``). Supported: ``LlamaAttention``, ``Qwen2Attention``,
``Qwen3Attention`` (full causal attention, RoPE over the whole head dimension, as in transformers
5.x). Any other class is an error naming it.

Over 400 lines because the hooks, the RoPE replay and the batch reductions must agree on one
layout of the captured states; kept beside each other they can be checked against the eager maps
together (tests/credit/test_capture.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from credo.credit.attention import rhythm_gamma
from credo.credit.batched import batched_flow_throughput, batched_head_stats, group_heads_rows, pack_tokens
from credo.credit.flow import flow_gamma

__all__ = [
    "SUPPORTED_ATTENTION",
    "default_layers",
    "attention_modules",
    "QKCapture",
    "capture_qk",
    "rhythm_gamma_from_qk",
    "flow_gamma_from_qk",
    "model_rhythm_gamma",
    "model_flow_gamma",
]

SUPPORTED_ATTENTION = ("LlamaAttention", "Qwen2Attention", "Qwen3Attention")
"""Attention classes whose query/key path is ``[norm](proj(h)) -> RoPE(cos, sin)``."""

_STATS_KEYS = ("head_quantile", "window", "h_lo", "h_hi")
_RHYTHM_KEYS = ("q", "gamma_amp", "k", "alpha", "tau_waad", "tau_delta", "sign_mode")
_FLOW_KEYS = ("edge_threshold", "normalize")
_FLOW_GAMMA_KEYS = ("q", "gamma_flow", "sign_mode")
_STREAM_KEYS = ("block_size", "scores_per_step")


def default_layers(num_layers: int) -> list[int]:
    """Five evenly spaced layers in the middle third of a ``num_layers``-deep network.

    The paper (arXiv 2510.13554) samples "5 evenly spaced layers from the middle third". Inferred
    bounds: the middle third is layers ``floor(L / 3) .. ceil(2 L / 3) - 1``; the five points of
    ``linspace`` over it are rounded half up and deduplicated (fewer than five on shallow models).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers}, expected a positive int")
    lo, hi = num_layers // 3, max(num_layers // 3, math.ceil(2 * num_layers / 3) - 1)
    points = [lo + (hi - lo) * i / 4 for i in range(5)]
    return sorted({int(math.floor(p + 0.5)) for p in points})


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in depth order.

    A decoder layer is any module with a ``self_attn`` child (Llama/Qwen layout). Raises if there
    is none, or if an attention class is not in :data:`SUPPORTED_ATTENTION`.
    """
    found = [m.self_attn for m in model.modules() if isinstance(getattr(m, "self_attn", None), torch.nn.Module)]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no decoder layer with a 'self_attn' module; expected a "
            f"Llama/Qwen-style decoder with attention classes {SUPPORTED_ATTENTION}"
        )
    for module in found:
        name = type(module).__name__
        if name not in SUPPORTED_ATTENTION:
            raise TypeError(
                f"attention module class {name} is not supported by the q/k capture hooks "
                f"(supported: {', '.join(SUPPORTED_ATTENTION)})"
            )
        missing = [a for a in ("q_proj", "k_proj", "head_dim", "scaling", "config") if not hasattr(module, a)]
        if missing:
            raise TypeError(f"attention module class {name} lacks attributes {missing} the capture hooks read")
    return found


def _check_layers(layers: list[int] | None, depth: int) -> list[int]:
    layers = default_layers(depth) if layers is None else list(layers)
    if not layers:
        raise ValueError("layers is empty, expected at least one decoder layer index")
    bad = [i for i in layers if not isinstance(i, int) or not 0 <= i < depth]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {depth} decoder layers (valid 0..{depth - 1})")
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers={layers} has duplicates, expected distinct layer indices")
    return layers


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class QKCapture:
    """States captured by :func:`capture_qk`: per sampled layer, ``q [B, H, N, d]`` and ``k [B, H_kv, N, d]``.

    Attributes:
        layers: the sampled decoder layer indices, in the order given.
        scale: the attention logit scale (``module.scaling``), shared by the sampled layers.
        states: ``{layer: {"q": tensor, "k": tensor}}``, filled by the forward pass.
        compute_device: where the states were computed (the model's device); :meth:`sequence`
            returns them there, so states kept on ``storage_device="cpu"`` are reduced on the GPU.
        hook_s: host seconds spent in the hooks (RoPE replay and copies; on a GPU without
            synchronisation, so a lower bound there).
    """

    layers: list[int]
    scale: float
    states: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    compute_device: torch.device | None = None
    hook_s: float = 0.0

    def check_complete(self) -> None:
        """Raise if a sampled layer's query or key states were not captured."""
        missing = [i for i in self.layers if not {"q", "k"} <= set(self.states.get(i, {}))]
        if missing:
            raise RuntimeError(
                f"no query/key states were captured for layers {missing}: run one forward pass of the "
                "model inside capture_qk (the hooks saw none for these layers)"
            )

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q [L, B, H, N, d], k [L, B, H_kv, N, d])`` over the sampled layers (a copy)."""
        self.check_complete()
        q = torch.stack([self.states[i]["q"] for i in self.layers])
        k = torch.stack([self.states[i]["k"] for i in self.layers])
        return q, k

    def sequence(self, b: int, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q [L, H, n, d], k [L, H_kv, n, d])`` of sequence ``b`` at positions ``tokens [n]``."""
        self.check_complete()
        tokens = tokens.to(self.states[self.layers[0]]["q"].device)
        q = torch.stack([self.states[i]["q"][b][:, tokens] for i in self.layers])
        k = torch.stack([self.states[i]["k"][b][:, tokens] for i in self.layers])
        return q.to(self.compute_device), k.to(self.compute_device)

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, N)`` of the captured forward."""
        self.check_complete()
        q = self.states[self.layers[0]]["q"]
        return q.shape[0], q.shape[2]


@contextlib.contextmanager
def capture_qk(
    model: torch.nn.Module, layers: list[int] | None = None, *, storage_device: str | torch.device | None = None
) -> Iterator[QKCapture]:
    """Capture post-RoPE query/key states of ``layers`` during the forward passes run inside.

    Only the first forward pass is kept (a gradient-checkpointing recompute would fire the hooks
    again). The states are detached and keep the model's dtype.

    Args:
        model: a Llama/Qwen-style decoder (any wrapper whose modules include the decoder layers).
        layers: decoder layer indices (default :func:`default_layers` of the model's depth).
        storage_device: where to keep the states (default: where they are computed). ``"cpu"``
            moves them off the accelerator during the forward; the reductions move one sequence
            at a time back to the compute device.

    Yields:
        a :class:`QKCapture`, filled when the forward pass returns.
    """
    modules = attention_modules(model)
    layers = _check_layers(layers, len(modules))
    scales = {float(modules[i].scaling) for i in layers}
    if len(scales) != 1:
        raise ValueError(f"layers {layers} use different attention scales {sorted(scales)}, expected one")
    capture = QKCapture(layers=layers, scale=scales.pop())
    handles = []

    def pre_hook(index, module, args, kwargs):
        if {"q", "k"} <= set(capture.states.get(index, {})):
            return  # already captured: see state_hook
        embeddings = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
        if embeddings is None:
            raise RuntimeError(
                f"{type(module).__name__} (layer {index}) was called without position_embeddings=(cos, sin); "
                "the capture hooks expect the transformers 5.x attention signature"
            )
        window = getattr(module, "sliding_window", None)
        n = embeddings[0].shape[-2]
        if window is not None and n > window:
            raise ValueError(
                f"layer {index} ({type(module).__name__}) uses sliding-window attention (window {window}) over "
                f"{n} tokens; the capture assumes full causal attention"
            )
        capture.states.setdefault(index, {}).setdefault("_rope", embeddings)

    def state_hook(index, name, module, args, output):
        slot = capture.states.setdefault(index, {})
        if name in slot:
            return  # a recompute (gradient checkpointing) or a second forward: keep the first
        attn = modules[index]
        cos, sin = slot["_rope"]
        start = time.perf_counter()
        with torch.no_grad():
            x = output.detach()
            x = x.view(*x.shape[:2], -1, attn.head_dim).transpose(1, 2)  # [B, heads, N, d]
            if cos.shape[-1] != x.shape[-1]:
                raise ValueError(
                    f"layer {index}: RoPE cos has last dim {cos.shape[-1]}, expected head_dim {x.shape[-1]} "
                    "(partial rotary embeddings are not supported)"
                )
            c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
            capture.compute_device = x.device
            rotated = x * c + _rotate_half(x) * s
            slot[name] = rotated if storage_device is None else rotated.to(storage_device)
        capture.hook_s += time.perf_counter() - start
        if "q" in slot and "k" in slot:
            slot.pop("_rope", None)

    try:
        for index in layers:
            attn = modules[index]
            handles.append(attn.register_forward_pre_hook(
                lambda m, a, kw, i=index: pre_hook(i, m, a, kw), with_kwargs=True))
            # Qwen3 normalises each head after the projection and before RoPE.
            q_source = attn.q_norm if getattr(attn, "q_norm", None) is not None else attn.q_proj
            k_source = attn.k_norm if getattr(attn, "k_norm", None) is not None else attn.k_proj
            handles.append(q_source.register_forward_hook(lambda m, a, o, i=index: state_hook(i, "q", m, a, o)))
            handles.append(k_source.register_forward_hook(lambda m, a, o, i=index: state_hook(i, "k", m, a, o)))
        yield capture
    finally:
        for handle in handles:
            handle.remove()


def _split_kwargs(kwargs: dict, allowed: tuple[str, ...], fn: str) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"{fn} got unexpected keyword arguments {unknown} (accepted: {sorted(allowed)})")


def _check_masks(input_ids: torch.Tensor, **masks: torch.Tensor | None) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids has shape {list(input_ids.shape)}, expected [B, N]")
    for name, mask in masks.items():
        if mask is not None and tuple(mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name} has shape {list(mask.shape)}, expected {list(input_ids.shape)} like input_ids")


def _packed_layers(capture: QKCapture, index: torch.Tensor, valid: torch.Tensor):
    """Yield ``(layer, q [B, H, n, d], k [B, H_kv, n, d])`` packed by ``index``, one layer at a time.

    Padding slots hold whatever the forward left there (credo.credit.batched scrubs them). Non-finite
    states on real tokens are an error, not silently ranked (they arise, for instance, when padding
    rows turn NaN and leak into real tokens in a float64 eager forward); it is raised once all
    layers are seen, naming the first bad sequence's layers.
    """
    capture.check_complete()
    bad: dict[tuple[int, int], list[int]] = {}
    # Right padding (the trainer's layout) packs to itself: no gather copy.
    identity = index.shape[1] == capture.shape[1] and bool(
        (index == torch.arange(index.shape[1], device=index.device)).all())
    for layer in capture.layers:
        out = []
        for kind, name in enumerate(("q", "k")):
            states = capture.states[layer][name].to(capture.compute_device)
            b, heads, _, d = states.shape
            packed = states if identity else states.gather(2, index[:, None, :, None].expand(b, heads, index.shape[1], d))
            # A float32 sum is non-finite iff an entry is (q/k entries are far below overflow);
            # much cheaper on CPU than isfinite over every entry.
            finite = (torch.isfinite(packed.float().sum(dim=(1, 3))) | ~valid).all(dim=1)
            for seq in (~finite).nonzero().flatten().tolist():
                bad.setdefault((seq, kind), []).append(layer)
            out.append(packed)  # padding slots are scrubbed by credo.credit.batched
        yield layer, out[0], out[1]
    if bad:
        (seq, kind), layers = min(bad.items())
        name = ("query", "key")[kind]
        raise ValueError(f"sequence {seq}: non-finite {name} states on real tokens at layers {layers}")


def _pack(x: torch.Tensor | None, index: torch.Tensor, valid: torch.Tensor, fill=0):
    if x is None:
        return None
    packed = x.to(index.device).gather(1, index)
    return torch.where(valid, packed, torch.full_like(packed, fill))


def _unpack(packed: torch.Tensor, index: torch.Tensor, valid: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` float32 ones with the valid packed values put back at their columns."""
    out = torch.ones(like.shape, dtype=torch.float32, device=index.device)
    out = out.scatter(1, index, torch.where(valid, packed.float(), torch.ones_like(packed, dtype=torch.float32)))
    return out.to(like.device)


def rhythm_gamma_from_qk(
    capture: QKCapture,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    strategy: str = "coupled",
    advantages: torch.Tensor | None = None,
    **rhythm_kwargs,
) -> torch.Tensor:
    """Preplan-and-anchor multipliers from captured states (arXiv 2510.13554, Eq. 7-19).

    For each sequence: the per-head span, WAAD and FAI of its non-padding tokens in all sampled
    layers, heads grouped jointly (as :func:`~credo.credit.attention.group_heads`), WAAD averaged
    over the local heads, FAI over the global heads, then :func:`~credo.credit.attention.rhythm_gamma`.
    Equals :func:`~credo.credit.attention.attention_rhythm_gamma` on the sequence's dense maps.
    The whole batch is reduced at once (:func:`credo.credit.batched.batched_head_stats` on the
    real tokens packed to the left), one sampled layer at a time.

    Args:
        capture: from :func:`capture_qk` after the forward pass.
        attention_mask: ``[B, N]`` 1 on real tokens (padding anywhere, left or right).
        response_mask: ``[B, N]`` bool response tokens.
        strategy: ``"local"``, ``"global"`` or ``"coupled"``.
        advantages: ``[B, N]``, only for ``sign_mode != "both"``.
        rhythm_kwargs: ``head_quantile, window, h_lo, h_hi`` (statistics), ``q, gamma_amp, k, alpha,
            tau_waad, tau_delta, sign_mode`` (:func:`rhythm_gamma`), ``block_size, scores_per_step``
            (streaming: query rows per block, attention scores computed at once).

    Returns:
        ``[B, N]`` float32 detached multipliers, 1 on padding and outside the response.
    """
    _split_kwargs(rhythm_kwargs, _STATS_KEYS + _RHYTHM_KEYS + _STREAM_KEYS, "rhythm_gamma_from_qk")
    _check_batch(capture, attention_mask, response_mask, advantages)
    stats_kw = {key: rhythm_kwargs[key] for key in ("window", "h_lo", "h_hi") if key in rhythm_kwargs}
    stream_kw = {key: rhythm_kwargs[key] for key in _STREAM_KEYS if key in rhythm_kwargs}
    rule_kw = {key: rhythm_kwargs[key] for key in _RHYTHM_KEYS if key in rhythm_kwargs}
    quantile = rhythm_kwargs.get("head_quantile", 0.3)
    index, valid = pack_tokens(attention_mask.to(capture.compute_device))
    if valid.shape[1] == 0:
        return torch.ones(attention_mask.shape, dtype=torch.float32, device=attention_mask.device)
    response = _pack(response_mask.bool(), index, valid, fill=False)
    spans, waads, fais = [], [], []
    for _, q, k in _packed_layers(capture, index, valid):
        span, waad_h, fai_h = batched_head_stats(q, k, valid, response, scale=capture.scale, **stats_kw, **stream_kw)
        spans.append(span), waads.append(waad_h), fais.append(fai_h)
    # Heads are grouped per sequence over all sampled (layer, head) pairs, layer-major.
    local, global_ = group_heads_rows(torch.cat(spans, dim=1), quantile)
    local, global_ = local.to(waads[0].dtype), global_.to(waads[0].dtype)
    waad_t = torch.einsum("bp,bpn->bn", local, torch.cat(waads, dim=1)) / local.sum(1, keepdim=True)
    fai_t = torch.einsum("bp,bpn->bn", global_, torch.cat(fais, dim=1)) / global_.sum(1, keepdim=True)
    g = rhythm_gamma(waad_t, fai_t, strategy=strategy, response_mask=response,
                     advantages=_pack(advantages, index, valid), **rule_kw)
    return _unpack(g, index, valid, attention_mask)


def flow_gamma_from_qk(
    capture: QKCapture,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    advantages: torch.Tensor | None = None,
    **flow_kwargs,
) -> torch.Tensor:
    """FlowTracer multipliers from captured states (arXiv 2606.10646).

    For each sequence: the throughput of its non-padding tokens (as
    :func:`~credo.credit.streaming.streaming_flow_throughput`), averaged over all sampled layers
    and heads, from the question (non-padding tokens outside the response) to ``answer_mask``, then
    :func:`~credo.credit.flow.flow_gamma`. The whole batch is reduced at once
    (:func:`credo.credit.batched.batched_flow_throughput`); the packed states of all sampled layers
    are one extra copy of the captured states.

    Args:
        capture: from :func:`capture_qk` after the forward pass.
        attention_mask: ``[B, N]`` 1 on real tokens.
        response_mask: ``[B, N]`` bool response tokens (the selectable ones).
        answer_mask: ``[B, N]`` bool answer tokens (the flow's sink).
        advantages: ``[B, N]``, only for ``sign_mode != "both"``.
        flow_kwargs: ``edge_threshold, normalize`` (throughput), ``q, gamma_flow, sign_mode``
            (:func:`flow_gamma`), ``block_size, scores_per_step`` (streaming).

    Returns:
        ``[B, N]`` float32 detached multipliers, 1 on padding and outside the response.
    """
    _split_kwargs(flow_kwargs, _FLOW_KEYS + _FLOW_GAMMA_KEYS + _STREAM_KEYS, "flow_gamma_from_qk")
    _check_batch(capture, attention_mask, response_mask, advantages, answer_mask)
    flow_kw = {key: flow_kwargs[key] for key in _FLOW_KEYS + _STREAM_KEYS if key in flow_kwargs}
    gamma_kw = {key: flow_kwargs[key] for key in _FLOW_GAMMA_KEYS if key in flow_kwargs}
    index, valid = pack_tokens(attention_mask.to(capture.compute_device))
    if valid.shape[1] == 0:
        return torch.ones(attention_mask.shape, dtype=torch.float32, device=attention_mask.device)
    response = _pack(response_mask.bool(), index, valid, fill=False)
    answer = _pack(answer_mask.bool(), index, valid, fill=False)
    # All sampled layers side by side as one head axis: the flow averages over every (layer, head).
    layers = list(_packed_layers(capture, index, valid))
    q = torch.cat([q for _, q, _ in layers], dim=1)
    k = torch.cat([k for _, _, k in layers], dim=1)
    del layers
    throughput = batched_flow_throughput(q, k, valid, valid & ~response, answer, scale=capture.scale, **flow_kw)
    g = flow_gamma(throughput, response_mask=response, advantages=_pack(advantages, index, valid), **gamma_kw)
    return _unpack(g, index, valid, attention_mask)


def _check_batch(capture: QKCapture, attention_mask, response_mask, advantages, answer_mask=None) -> None:
    expected = list(capture.shape)
    for name, t in (("attention_mask", attention_mask), ("response_mask", response_mask),
                    ("advantages", advantages), ("answer_mask", answer_mask)):
        if t is not None and list(t.shape) != expected:
            raise ValueError(f"{name} has shape {list(t.shape)}, expected {expected} like the captured input_ids")


def _forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """One no-grad forward of the decoder body (no LM head: the logits are not needed)."""
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    body = body if isinstance(body, torch.nn.Module) else model
    with torch.no_grad():
        body(input_ids=input_ids, attention_mask=attention_mask)


def model_rhythm_gamma(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    layers: list[int] | None = None,
    strategy: str = "coupled",
    storage_device: str | torch.device | None = None,
    **rhythm_kwargs,
) -> torch.Tensor:
    """Preplan-and-anchor multipliers of a batch from one forward pass (arXiv 2510.13554).

    For each sequence, equal to :func:`credo.credit.attention_rhythm_gamma` on its own attention
    maps of ``layers`` (``[L, H, n, n]`` over its ``n`` non-padding tokens, as the eager model
    returns them), without materialising them: q/k are captured with :func:`capture_qk` and
    reduced by the streaming functions. The model's mode is left as is (call ``model.eval()``
    for dropout-free attention).

    Args:
        model: a supported decoder (see :data:`SUPPORTED_ATTENTION`), any attention implementation.
        input_ids: ``[B, N]`` long.
        attention_mask: ``[B, N]`` 1 on real tokens, 0 on padding (left or right).
        response_mask: ``[B, N]`` bool response tokens.
        layers: decoder layer indices (default :func:`default_layers`).
        strategy: ``"local"``, ``"global"`` or ``"coupled"``.
        storage_device: where the captured states wait for the reduction (see :func:`capture_qk`).
        rhythm_kwargs: see :func:`rhythm_gamma_from_qk` (also ``advantages [B, N]``).

    Returns:
        ``[B, N]`` float32 multipliers, 1.0 on padding.
    """
    _check_masks(input_ids, attention_mask=attention_mask, response_mask=response_mask)
    with capture_qk(model, layers, storage_device=storage_device) as capture:
        _forward(model, input_ids, attention_mask)
    return rhythm_gamma_from_qk(capture, attention_mask, response_mask, strategy=strategy, **rhythm_kwargs)


def model_flow_gamma(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    layers: list[int] | None = None,
    storage_device: str | torch.device | None = None,
    **flow_kwargs,
) -> torch.Tensor:
    """FlowTracer multipliers of a batch from one forward pass (arXiv 2606.10646).

    For each sequence, equal to ``flow_gamma(flow_throughput(maps, question, answer),
    response_mask=response)`` with ``maps`` its attention maps of ``layers`` over its non-padding
    tokens (averaged over those layers and all heads) and ``question`` its non-padding tokens
    outside the response; computed from captured q/k in ``O(block_size * N)`` memory per head step.

    Args:
        model, input_ids, attention_mask, response_mask, layers, storage_device: as in
            :func:`model_rhythm_gamma`.
        answer_mask: ``[B, N]`` bool answer tokens.
        flow_kwargs: see :func:`flow_gamma_from_qk` (also ``advantages [B, N]``).

    Returns:
        ``[B, N]`` float32 multipliers, 1.0 on padding.
    """
    _check_masks(input_ids, attention_mask=attention_mask, response_mask=response_mask, answer_mask=answer_mask)
    with capture_qk(model, layers, storage_device=storage_device) as capture:
        _forward(model, input_ids, attention_mask)
    return flow_gamma_from_qk(capture, attention_mask, response_mask, answer_mask, **flow_kwargs)
