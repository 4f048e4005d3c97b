"""The policy scorer: log-probs and entropy of a batch's tokens, with probes on the recompute forward.

`PolicyScorer` binds the sampling temperature, the log-prob chunk size and the ZeRO-3 path once, so
every forward over training tokens (the old-policy recompute, the reference model, each micro-batch of
the update) scores tokens the same way the sampler drew them.

Probes ride the batch-level recompute, the one no-grad forward over the training tokens before the
update:

    class Probe(Protocol):
        name: str
        def capture(self, model) -> ContextManager      # forward hooks live while this is entered
        def result(self, batch: Batch, log_probs, entropy) -> dict[str, Tensor]   # each [B, T]

A probe's outputs land in `batch.extras['<name>/<key>']`; an output named `weights` is a per-token
loss weight and is multiplied into `batch.weights`, which the objective passes to the loss as
`weights=`. So a credit method that produces weights needs no trainer edit.

Soft prefixes: a batch whose rollout source set `Batch.prefix_embeds` ([B, k, d], e.g. a decoded latent
reasoning context) is scored with those embeddings before each row's tokens in every forward here (recompute, reference,
update), the same rows the rollout engine read before the prompt; the outputs keep their [B, T] shape.

When the update is one on-policy pass (`ppo_epochs * mini_batches == 1`) there is no recompute to ride:
rather than paying a forward of its own, a probe that sets `rides_update = True` rides the update's
forward of each micro-batch (`PolicyScorer.update_forward`). That forward runs the weights that the
recompute would have run (one optimizer step per batch), so the outputs are the same; `result` sees a
micro-batch view of the batch (rows sliced, its own `metrics`, and `source_rows` / `source_size`: its rows
in the whole batch and that batch's size), and the views' metrics are merged:
`perf/*` summed, `*_max` maxed, the others averaged weighted by loss tokens. A probe that reads its
entropy only sometimes says so with `needs_entropy` (default True).

It runs past 400 lines because every policy forward (recompute, reference, update; padded, packed and
token-budget layouts; soft prefixes and MoE router replay) goes through the one scorer here, so that they score
tokens alike: split by layout, the three forwards would drift apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import ContextManager, Protocol

import torch

from credo import algos
from credo.lora import BaseReference
from credo.moe import ForwardRouting, RoutingCounts, routing_or_none
from credo.train.batch import Batch
from credo.train.packing import PackedRows, row_lengths, token_micro_batches


class Probe(Protocol):
    name: str

    def capture(self, model: torch.nn.Module) -> ContextManager: ...

    def result(self, batch: Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None) -> dict[str, torch.Tensor]: ...


def policy_forward(model, input_ids, attention_mask, token_mask, *, temperature: float, chunk_size: int,
                   with_entropy: bool, hidden_path: bool = True, packed: bool = False,
                   prefix_embeds: torch.Tensor | None = None, kept_threshold: torch.Tensor | None = None,
                   routing: ForwardRouting | None = None):
    """Log-probs (and entropy) of input_ids[:, 1:] at `token_mask` positions.

    Args:
        input_ids: [B, L] long. attention_mask: [B, L]. token_mask: [B, L-1] bool, the rows to score.
        packed: run the model on the samples packed end to end without padding (`credo.train.packing`; the
            batch must be right-padded); the result is the same, in the same [B, L-1] layout.
        prefix_embeds: [B, k, d] soft-prompt embeddings read before each row's tokens (`Batch.prefix_embeds`), or
            None. Their k positions are dropped from the outputs, so the shapes do not change.
        kept_threshold: [B, L-1] float kept-set thresholds (`Batch.kept_threshold`), or None: the log-probs and the
            entropy are then those of the distribution renormalised over each token's kept set.
        routing: the rows' recorded MoE routing (`credo.moe.ForwardRouting`, experts [B, >= L-1, n_layers, k]): each
            router replays it (`algo.router_replay`) or compares its own choice with it; None: no record.
    Returns:
        log_probs [B, L-1] float32 and entropy [B, L-1] float32 (None without `with_entropy`), 0 off the mask.

    Takes the last hidden layer and computes log-softmax only on the selected rows with
    `credo.algos.logprobs_from_hidden`, so the [N, V] logits are never held at once.
    """
    B, T = token_mask.shape
    zero = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    if packed and prefix_embeds is not None:
        raise ValueError("policy_forward: packed rows cannot take prefix_embeds (a soft prefix needs its sample's own "
                         "padded row)")
    inputs, k = dict(input_ids=input_ids, attention_mask=attention_mask), 0
    if prefix_embeds is not None:
        inputs, k = prefixed_rows(model, input_ids, attention_mask, prefix_embeds), prefix_embeds.shape[1]
    tau = None if kept_threshold is None else kept_threshold[token_mask]
    if packed:
        lp_rows, ent_rows = _packed_rows(model, input_ids, attention_mask, token_mask, temperature=temperature,
                                         chunk_size=chunk_size, with_entropy=with_entropy, hidden_path=hidden_path,
                                         tau=tau, routing=routing)
    elif hidden_path:
        base = getattr(model, model.base_model_prefix)
        with routing_or_none(model, routing, None if routing is None else routing.padded(input_ids.shape[1], k)):
            hidden = base(**inputs).last_hidden_state[:, k:-1]
        head = model.get_output_embeddings()
        rows = hidden[token_mask]
        labels = input_ids[:, 1:][token_mask]
        out = algos.logprobs_from_hidden(rows, head.weight, labels, temperature=temperature, chunk_size=chunk_size,
                                         with_entropy=with_entropy, bias=getattr(head, "bias", None),
                                         kept_threshold=tau)
        lp_rows, ent_rows = (out if with_entropy else (out, None))
    else:  # ZeRO-3 partitions the head weight; let the model's own forward gather it
        with routing_or_none(model, routing, None if routing is None else routing.padded(input_ids.shape[1], k)):
            logits = model(**inputs).logits[:, k:-1]
        sel = logits[token_mask].float() / temperature  # response rows only, before any fp32 copy
        sel = sel if tau is None else _kept_only(sel, tau, input_ids[:, 1:][token_mask])
        logp = sel.log_softmax(-1)
        lp_rows = logp.gather(-1, input_ids[:, 1:][token_mask].unsqueeze(-1)).squeeze(-1)
        ent_rows = algos.entropy_from_logits(sel) if with_entropy else None
    log_probs = zero.masked_scatter(token_mask, lp_rows.float())
    entropy = zero.masked_scatter(token_mask, ent_rows.float()) if ent_rows is not None else None
    return log_probs, entropy


def prefixed_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_embeds: torch.Tensor) -> dict:
    """`inputs_embeds` [B, k + L, d] (the prefix, then the token embeddings of the right-padded rows) and the
    attention mask [B, k + L]: the prefix takes positions 0..k-1, as in the rollout's left-padded prompt."""
    tokens = model.get_input_embeddings()(input_ids)
    ones = torch.ones(prefix_embeds.shape[:2], dtype=attention_mask.dtype, device=attention_mask.device)
    return dict(inputs_embeds=torch.cat([prefix_embeds.to(tokens), tokens], 1),
                attention_mask=torch.cat([ones, attention_mask], 1))


def _kept_only(sel: torch.Tensor, tau: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Scaled logits sel [N, V] set to -inf outside each row's kept set (tau [N]) and its label [N], out of place (sel
    is part of the autograd graph)."""
    return sel.masked_fill(~algos.kept_mask(sel.detach(), tau, labels), float("-inf"))


def _packed_rows(model, input_ids, attention_mask, token_mask, *, temperature: float, chunk_size: int,
                 with_entropy: bool, hidden_path: bool, tau: torch.Tensor | None = None,
                 routing: ForwardRouting | None = None):
    """`policy_forward`'s selected log-probs [N] (and entropy [N] or None) from one packed forward, in the order
    `token_mask` selects them. `use_cache=False`: a cache would make transformers ignore the packed positions."""
    packed = PackedRows.of(input_ids, attention_mask)
    where = packed.flat_index(token_mask)
    labels = input_ids[:, 1:][token_mask]
    inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False)
    experts = None if routing is None else routing.packed(packed.starts, row_lengths(attention_mask).tolist(),
                                                          packed.input_ids.numel())
    if hidden_path:
        base = getattr(model, model.base_model_prefix)
        with routing_or_none(model, routing, experts):
            hidden = base(**inputs).last_hidden_state
        head = model.get_output_embeddings()
        out = algos.logprobs_from_hidden(hidden.flatten(0, 1)[where], head.weight, labels, temperature=temperature,
                                         chunk_size=chunk_size, with_entropy=with_entropy,
                                         bias=getattr(head, "bias", None), kept_threshold=tau)
        return out if with_entropy else (out, None)
    with routing_or_none(model, routing, experts):
        logits = model(**inputs).logits  # ZeRO-3: the model's own head gathers its partitioned weight
    sel = logits.flatten(0, 1)[where].float() / temperature
    sel = sel if tau is None else _kept_only(sel, tau, labels)
    logp = sel.log_softmax(-1)
    lp_rows = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return lp_rows, (algos.entropy_from_logits(sel) if with_entropy else None)


class PolicyScorer:
    """Scores batches with the policy (and the frozen reference), at one temperature bound at build time."""

    def __init__(self, *, temperature: float, chunk_size: int, hidden_path: bool, needs_old_log_probs: bool,
                 ref_model: torch.nn.Module | None = None, probes: list[Probe] = (), packed: bool = False,
                 micro_batch_tokens: int = 0, old_log_probs: str = "recompute", router_replay: bool = False):
        self.temperature, self.chunk_size, self.hidden_path = temperature, chunk_size, hidden_path
        self.needs_old_log_probs = needs_old_log_probs
        # algo.old_log_probs: 'rollout' takes pi_old from the sampler (verl's bypass mode): no policy forward for it
        self.old_from_rollout = old_log_probs == "rollout"
        # algo.packing / algo.micro_batch_tokens: forwards packed (or padded only to their own longest sample), and
        # the recompute split by the token budget; probes keep the padded forward of the rows they are given
        self.packed, self.micro_batch_tokens = packed, micro_batch_tokens
        self.trim = packed or micro_batch_tokens > 0
        self.ref_model = ref_model
        self.probes = list(probes)
        # Without a recompute forward (one on-policy pass), probes that can ride the update's forward do.
        self.update_probes = [p for p in self.probes if not needs_old_log_probs and getattr(p, "rides_update", False)]
        self.recompute_probes = [p for p in self.probes if p not in self.update_probes]
        self._merge_tokens: tuple = (None, {})
        # algo.router_replay: every policy forward of a batch with recorded MoE routing routes through it (R3); without
        # it the pi_old forward only compares its routing with the record (moe/routing_disagreement)
        self.router_replay = router_replay

    def __call__(self, model, input_ids, attention_mask, token_mask, *, with_entropy: bool, hidden_path: bool | None = None,
                 prefix_embeds: torch.Tensor | None = None, kept_threshold: torch.Tensor | None = None,
                 routing: ForwardRouting | None = None):
        """Log-probs (and entropy) [B, T] of `model` on the given rows; see `policy_forward`. `model` may be a LoRA
        run's reference (`credo.lora.BaseReference`): the policy's module, scored with its adapter off."""
        context = contextlib.nullcontext()
        if isinstance(model, BaseReference):
            model, context = model.module, model.adapter_off()
        with context:
            return self._forward(model, input_ids, attention_mask, token_mask, with_entropy=with_entropy,
                                 hidden_path=hidden_path, prefix_embeds=prefix_embeds, kept_threshold=kept_threshold,
                                 routing=routing)

    def _forward(self, model, input_ids, attention_mask, token_mask, *, with_entropy: bool, hidden_path: bool | None,
                 prefix_embeds: torch.Tensor | None, kept_threshold: torch.Tensor | None = None,
                 routing: ForwardRouting | None = None):
        """Log-probs (and entropy) [B, T] of `model` on the given rows; see `policy_forward`. With packing or a
        token budget the rows (right-padded) are cut to their longest sample, or packed, and the outputs padded
        back to T. Soft prefixes (`prefix_embeds` [B, k, d]) take the padded path (a recipe cannot combine them with
        packing or a token budget)."""
        hidden_path = self.hidden_path if hidden_path is None else hidden_path
        if not self.trim or prefix_embeds is not None:
            return policy_forward(model, input_ids, attention_mask, token_mask, temperature=self.temperature,
                                  chunk_size=self.chunk_size, with_entropy=with_entropy, hidden_path=hidden_path,
                                  prefix_embeds=prefix_embeds, kept_threshold=kept_threshold, routing=routing)
        width = int(row_lengths(attention_mask).max())
        lp, ent = policy_forward(model, input_ids[:, :width], attention_mask[:, :width], token_mask[:, :width - 1],
                                 temperature=self.temperature, chunk_size=self.chunk_size, with_entropy=with_entropy,
                                 hidden_path=hidden_path, packed=self.packed,
                                 kept_threshold=None if kept_threshold is None else kept_threshold[:, :width - 1],
                                 routing=routing)
        extra = token_mask.shape[1] - (width - 1)
        return torch.nn.functional.pad(lp, (0, extra)), None if ent is None else torch.nn.functional.pad(ent, (0, extra))

    def _whole_batch(self, model, batch: Batch, *, with_entropy: bool, hidden_path: bool | None = None,
                     routing: ForwardRouting | None = None):
        """Log-probs (and entropy) [B, T] of the whole batch: one forward, or (with algo.micro_batch_tokens) one per
        token-budget group of rows."""
        prefix = getattr(batch, "prefix_embeds", None)
        kept = getattr(batch, "kept_threshold", None)
        if not self.micro_batch_tokens or prefix is not None:
            return self(model, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=with_entropy,
                        hidden_path=hidden_path, prefix_embeds=prefix, kept_threshold=kept, routing=routing)
        lengths = row_lengths(batch.attention_mask).tolist()
        lp = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.input_ids.device)
        ent = torch.zeros_like(lp) if with_entropy else None
        for group in token_micro_batches(lengths, self.micro_batch_tokens, packed=self.packed):
            rows = torch.tensor(group, device=lp.device)
            lp_g, ent_g = self(model, batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows],
                               with_entropy=with_entropy, hidden_path=hidden_path,
                               kept_threshold=None if kept is None else kept[rows],
                               routing=None if routing is None else routing.rows(rows))
            lp[rows] = lp_g
            if ent is not None:
                ent[rows] = ent_g
        return lp, ent

    @torch.no_grad()
    def recompute(self, model: torch.nn.Module, batch: Batch) -> None:
        """Fill `batch.old_log_probs` (off-policy passes), `batch.ref_log_probs` and the probes' outputs.

        The policy forward runs when old log-probs are needed or a probe asks for it; an on-policy
        single pass takes pi_old inside the update instead. With `algo.old_log_probs: rollout` pi_old is the
        sampler's log-probs (`batch.rollout_log_probs`) in every case, and only probes make the forward run.

        Kept-set replay with a sampler that did not record its sets (vLLM: `batch.kept_rule` set, no
        `batch.kept_threshold`): the sets are first computed from this model's (pi_old's) logits, one more forward.
        """
        rule = getattr(batch, "kept_rule", None)
        if rule is not None and rule.get("replay") and batch.kept_threshold is None:
            batch.kept_threshold = kept_thresholds_of(model, batch, temperature=self.temperature,
                                                      chunk_size=self.chunk_size, hidden_path=self.hidden_path)
        kept = getattr(batch, "kept_threshold", None)
        recompute_old = self.needs_old_log_probs and not self.old_from_rollout
        if self.old_from_rollout:
            batch.old_log_probs = rollout_as_old(batch)
        if recompute_old or self.recompute_probes:
            routing = self.routing(batch, counted=True)  # this forward runs pi_old's weights: its routing is counted
            with contextlib.ExitStack() as hooks:
                for probe in self.recompute_probes:
                    hooks.enter_context(probe.capture(model))
                # A probe that never reads the entropy (`needs_entropy = False`) spares its computation.
                with_entropy = any(getattr(probe, "needs_entropy", True) for probe in self.recompute_probes)
                if self.recompute_probes and self.trim:  # probes capture the padded forward of the whole batch
                    lp, ent = policy_forward(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                             temperature=self.temperature, chunk_size=self.chunk_size,
                                             with_entropy=with_entropy, hidden_path=self.hidden_path,
                                             kept_threshold=kept, routing=routing)
                else:
                    lp, ent = self._whole_batch(model, batch, with_entropy=with_entropy, routing=routing)
            if recompute_old:
                batch.old_log_probs = lp
            for probe in self.recompute_probes:
                _store_probe_outputs(probe, probe.result(batch, lp, ent), batch)
        if self.ref_model is not None:  # the frozen reference routes itself: the record is the policy's
            batch.ref_log_probs, _ = self._whole_batch(self.ref_model, batch, with_entropy=False, hidden_path=True)

    def routing(self, batch: Batch, *, counted: bool, rows: torch.Tensor | None = None) -> ForwardRouting | None:
        """The recorded routing of a policy forward over `batch` (its `rows`), replayed under algo.router_replay;
        `counted`: the forward runs pi_old's weights, and its disagreement with the record goes to
        `batch.routing_counts`. None when the batch has no record.

        Raises:
            ValueError: algo.router_replay is on and the batch's samples recorded no routing.
        """
        experts = getattr(batch, "routed_experts", None)
        if experts is None:
            if self.router_replay and bool(batch.loss_mask.any()):
                raise ValueError(f"algo.router_replay is on but the samples of step {batch.step} carry no recorded "
                                 "routing (Sample.routed_experts): the rollout must capture it (the hf backend with an "
                                 "MoE policy and the default rollout source, docs/moe.md)")
            return None
        if not (self.router_replay or counted):  # nothing to replay, nothing to count: the plain forward
            return None
        counts = None
        if counted:
            if batch.routing_counts is None:
                batch.routing_counts = RoutingCounts()
            counts = batch.routing_counts
        out = ForwardRouting(experts, self.router_replay, counts)
        return out if rows is None else out.rows(rows)


    def update_forward(self, model: torch.nn.Module, batch: Batch, rows: torch.Tensor):
        """The update's forward of micro-batch `rows` (log-probs and entropy, with grad), probes riding it.

        Args:
            rows: [b] long indices of the micro-batch in `batch`.
        Returns:
            log_probs, entropy: [b, T] float32, as `__call__` with `with_entropy=True`.
        """
        mask = batch.loss_mask[rows]
        prefix = getattr(batch, "prefix_embeds", None)
        prefix = None if prefix is None else prefix[rows]
        kept = getattr(batch, "kept_threshold", None)
        kept = None if kept is None else kept[rows]
        # one on-policy pass (no pi_old recompute): this forward is pi_old's, its routing is counted
        routing = self.routing(batch, counted=batch.old_log_probs is None, rows=rows)
        if not self.update_probes:
            return self(model, batch.input_ids[rows], batch.attention_mask[rows], mask, with_entropy=True,
                        prefix_embeds=prefix, kept_threshold=kept, routing=routing)
        with contextlib.ExitStack() as hooks:
            for probe in self.update_probes:
                hooks.enter_context(probe.capture(model))
            if prefix is not None:
                lp, ent = self(model, batch.input_ids[rows], batch.attention_mask[rows], mask, with_entropy=True,
                               prefix_embeds=prefix, kept_threshold=kept, routing=routing)
            else:  # probes capture the padded forward of the micro-batch, packed or not
                lp, ent = policy_forward(model, batch.input_ids[rows], batch.attention_mask[rows], mask,
                                         temperature=self.temperature, chunk_size=self.chunk_size, with_entropy=True,
                                         hidden_path=self.hidden_path, kept_threshold=kept, routing=routing)
        view = _rows_view(batch, rows)
        for probe in self.update_probes:
            outputs = probe.result(view, lp.detach(), ent.detach())
            for key, value in outputs.items():
                _check_probe_output(probe, key, value, view)
                if key == "weights":
                    if batch.weights is None:
                        batch.weights = torch.ones(batch.loss_mask.shape, dtype=value.dtype, device=value.device)
                    batch.weights[rows] = batch.weights[rows] * value
                else:
                    name = f"{probe.name}/{key}"
                    if name not in batch.extras:
                        batch.extras[name] = value.new_zeros(batch.loss_mask.shape)
                    batch.extras[name][rows] = value
        if self._merge_tokens[0] is not batch:  # running token counts of the averaged metrics, per batch
            self._merge_tokens = (batch, {})
        _merge_metrics(batch.metrics, view.metrics, float(mask.sum()), self._merge_tokens[1])
        return lp, ent


@torch.no_grad()
def kept_thresholds_of(model, batch: Batch, *, temperature: float, chunk_size: int,
                       hidden_path: bool = True) -> torch.Tensor:
    """[B, T] float32 kept-set thresholds of `batch.kept_rule` computed from `model`'s own scaled logits on the response
    tokens (-inf elsewhere): the sets a sampler that does not report them (vLLM) drew from, up to its logits' noise.
    One no-grad forward, then a sort of each row's [V] logits, `chunk_size` rows at a time."""
    rule = {k: v for k, v in batch.kept_rule.items() if k != "replay"}
    mask = batch.response_mask
    out = torch.full(mask.shape, float("-inf"), dtype=torch.float32, device=batch.input_ids.device)
    prefix = getattr(batch, "prefix_embeds", None)
    inputs, k = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask), 0
    if prefix is not None:
        inputs, k = prefixed_rows(model, batch.input_ids, batch.attention_mask, prefix), prefix.shape[1]
    base, head = getattr(model, model.base_model_prefix, None), model.get_output_embeddings()
    if hidden_path and base is not None and head is not None:
        rows = base(**inputs).last_hidden_state[:, k:-1][mask]
        to_logits = lambda h: head(h)  # noqa: E731
    else:  # ZeRO-3 partitions the head weight: the model's own forward gathers it
        rows = model(**inputs).logits[:, k:-1][mask]
        to_logits = lambda h: h  # noqa: E731
    taus = [algos.kept_set_threshold(to_logits(rows[i:i + chunk_size]).float() / temperature, **rule)
            for i in range(0, rows.shape[0], chunk_size)]
    if taus:
        out[mask] = torch.cat(taus)
    return out


def rollout_as_old(batch: Batch) -> torch.Tensor:
    """pi_old under `algo.old_log_probs: rollout`: the sampler's log-probs [B, T] (`batch.rollout_log_probs`).

    Raises:
        ValueError: a sample with loss tokens carries no sampler log-probs (its pi_old would be log 1 = 0).
    """
    trains = batch.loss_mask.any(-1).tolist()
    missing = [i for i, s in enumerate(batch.samples) if trains[i] and not s.rollout_log_probs]
    if missing:
        raise ValueError(f"algo.old_log_probs = 'rollout' needs the sampler's log-probs, but sample {missing[0]} of "
                         f"step {batch.step} ({len(missing)} in all) has none (Sample.rollout_log_probs is empty); "
                         "the rollout source must record them, or use algo.old_log_probs: recompute")
    return batch.rollout_log_probs


def _rows_view(batch: Batch, rows: torch.Tensor) -> Batch:
    """A shallow copy of `batch` with its [B, ...] tensor fields (and lists) sliced to `rows`, empty metrics."""
    size = batch.loss_mask.shape[0]
    keep = rows.tolist()
    sliced = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == size:
            sliced[f.name] = value[rows]
        elif isinstance(value, list) and len(value) == size:
            sliced[f.name] = [value[i] for i in keep]
    view = dataclasses.replace(batch, **{**sliced, "extras": {}, "metrics": {}})
    view.source_rows, view.source_size = rows, size  # for probes whose draws must not depend on the split
    return view


def _merge_metrics(into: dict, new: dict, tokens: float, weights: dict) -> None:
    """Fold a micro-batch view's metrics `new` into `into`: perf/* summed, *_max maxed, others averaged
    weighted by `tokens` (the view's loss tokens; `weights` keeps each averaged key's running count)."""
    for key, value in new.items():
        if key not in weights:
            into[key] = value
            weights[key] = tokens
        elif key.startswith("perf/"):
            into[key] += value
        elif key.endswith("_max"):
            into[key] = max(into[key], value)
        else:
            total = weights[key] + tokens
            if total > 0:
                into[key] = (into[key] * weights[key] + value * tokens) / total
            weights[key] = total


def _store_probe_outputs(probe, outputs: dict, batch: Batch) -> None:
    for key, value in outputs.items():
        _check_probe_output(probe, key, value, batch)
        if key == "weights":
            batch.weights = value if batch.weights is None else batch.weights * value
        else:
            batch.extras[f"{probe.name}/{key}"] = value


def _check_probe_output(probe, key: str, value, batch: Batch) -> None:
    shape = tuple(batch.loss_mask.shape)
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"probe '{probe.name}' output '{key}' has shape {got}, expected {list(shape)} like batch.loss_mask")
    if key == "weights" and not torch.isfinite(value[batch.loss_mask]).all():
        raise ValueError(f"probe '{probe.name}' returned non-finite weights on loss tokens")
