"""The one batch type that flows through the stages of a train step, and `pack`.

    source.rollout(step) -> Batch(samples, problems, group_ids)     a rollout source fills the samples
    reward(batch)        -> rewards, valid                          a reward model scores them
    batch.pack(...)      -> input_ids ... loss_mask                 padded tensors, label-aligned
    advantage(batch)     -> advantages [B, T]                       outcome estimators, critics
    scorer.recompute     -> old/ref log-probs, probe extras, weights
    updater.update(batch)                                           the objective reads it, nothing else

Every stage reads and writes fields of this record; no stage passes tensors around it. Tensor fields
are label-aligned (torchtune's `Trajectory` convention for causal LMs): column j of a [B, T] field
scores token j+1 of `input_ids`, so T = L - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.distributed.rollout import Sample


@dataclass
class Batch:
    """One rank's share of a step: B samples (all G responses of a prompt stay on one rank).

    Filled stage by stage; a field is None until the stage that owns it has run.
    """

    samples: list[Sample]
    """B rollout records: token ids, sampler log-probs, response mask, policy version, per-turn meta."""
    problems: list[Any]
    """B task problems (prompt, answer, metadata), one per sample."""
    group_ids: torch.Tensor
    """[B] long: the prompt each sample answers, global across ranks (samples of a group share it)."""
    step: int = 0
    """The optimizer step this batch trains (the weights that sampled it are `samples[i].policy_version`)."""

    rewards: torch.Tensor | None = None
    """[B] float: outcome reward per sample (0.0 where the reward call failed)."""
    valid: torch.Tensor | None = None
    """[B] bool: False where the reward call raised or timed out; such samples train on nothing."""
    finished: torch.Tensor | None = None
    """[B] bool: the response ended with EOS (False: it hit the length cap)."""

    input_ids: torch.Tensor | None = None
    """[B, L] long: prompt + response, right-padded."""
    attention_mask: torch.Tensor | None = None
    """[B, L] long: 1 on real tokens."""
    response_mask: torch.Tensor | None = None
    """[B, T] bool: tokens the policy generated (mask 1 of `Sample.response_mask`), label-aligned."""
    loss_mask: torch.Tensor | None = None
    """[B, T] bool: the tokens the loss trains on: response tokens of kept samples (valid, and finished
    when the overlong filter is on)."""
    rollout_log_probs: torch.Tensor | None = None
    """[B, T] float: the sampler's log-probs (0 outside the response)."""
    old_log_probs: torch.Tensor | None = None
    """[B, T] float: log pi_old from before the update; None when the update is one on-policy pass
    (then pi_old = pi_theta detached, taken inside the update)."""
    ref_log_probs: torch.Tensor | None = None
    """[B, T] float: the frozen reference policy's log-probs (KL term); None without a reference."""
    values: torch.Tensor | None = None
    """[B, T] float: critic values (value-model advantage stages)."""
    advantages: torch.Tensor | None = None
    """[B, T] float: per-token advantages, 0 outside `loss_mask`."""
    weights: torch.Tensor | None = None
    """[B, T] float: per-token loss weights from credit stages and probes (None = all 1)."""
    entropy_mask: torch.Tensor | None = None
    """[B, T] bool: tokens whose entropy bonus counts (AsyPPO's entropy filter); None = all loss tokens."""
    kept_threshold: torch.Tensor | None = None
    """[B, T] float32: under kept-set replay (`rollout.kept_set_replay` with top-k/top-p/min-p), each token's kept-set
    threshold tau: every policy forward (pi_old, pi_theta, the reference) renormalises over
    K = {j : z_j - max z >= tau} plus the token itself, z its own scaled logits (`credo.algos.kept_set`); -inf off the
    response and where nothing was cut. From the sampler's records (hf), or computed by the scorer from pi_old's
    logits with `kept_rule` (vLLM). None: full-vocabulary log-probs (no replay)."""
    kept_rule: dict | None = None
    """The truncation the sampler applied, set by the default rollout source when it truncates: top_k, top_p, min_p
    and order ('hf' or 'vllm', whose stage order: `credo.algos.kept_set_threshold`'s keywords), and replay (bool,
    `rollout.kept_set_replay`); None when the sampler cut nothing."""
    routed_experts: torch.Tensor | None = None
    """[B, T, n_layers, k] int16: with routing capture (an MoE policy on the hf backend), the experts each MoE layer of
    the sampler routed input position j to (label-aligned: column j is the position that scores token j + 1), -1 where
    none was recorded; replayed in every policy forward under `algo.router_replay` (`credo.moe`, docs/moe.md). None:
    no record."""
    routing_counts: Any = None
    """`credo.moe.RoutingCounts` of the pi_old forward (trainer routing against the record), for
    `moe/routing_disagreement`; None when the batch has no record or no pi_old forward ran."""
    prefix_embeds: torch.Tensor | None = None
    """[B, k, d] float: soft-prompt embeddings every policy forward reads before a sample's tokens (rollout,
    recompute, reference, update), set by a rollout source that conditions the policy on a sampled latent;
    None (the default): no prefix."""
    train_policy: bool = True
    """False when the policy takes no update this step (e.g. critic-only warm-up steps)."""
    target_terms: dict[str, tuple[float, torch.Tensor]] = field(default_factory=dict)
    """Extra loss terms against frozen targets, set by a stage (on-policy distillation's teacher): name ->
    (coefficient, the target's log-probs of the sampled tokens [B, T]); the objective adds
    coefficient * aggregate((log pi_theta - target)^2 / 2) (`credo.algos.distill_kl_loss`) and logs `train/<name>`.
    Empty (the default): no such term."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Probe outputs, '<probe>/<name>' -> [B, T] (e.g. attention statistics)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-step metrics the stages report (logged as they are)."""

    def __len__(self) -> int:
        return len(self.samples)

    def to(self, device: torch.device) -> "Batch":
        """Move every tensor field (and the extras) to `device`, in place."""
        for name in ("input_ids", "attention_mask", "response_mask", "loss_mask", "rollout_log_probs", "old_log_probs",
                     "ref_log_probs", "values", "advantages", "weights", "entropy_mask",
                     "prefix_embeds", "kept_threshold", "routed_experts"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device))
        self.extras = {k: v.to(device) for k, v in self.extras.items()}
        self.target_terms = {k: (c, v.to(device)) for k, (c, v) in self.target_terms.items()}
        return self


def pack(samples: list[Sample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad prompt+response.

    Returns:
        input_ids [B, L] long, attention_mask [B, L] long, response_mask [B, L-1] bool and the sampler's
        log-probs [B, L-1] float, the last two label-aligned.
    """
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    # rows are built as Python lists and converted once: a tensor per row cost more than the forward
    # pass of a small model
    ids, attn, resp, rlp = [], [], [], []
    for i, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.response_ids)
        if p == 0:
            raise ValueError(f"sample {i} has an empty prompt_ids; the first response token needs a prompt token to be scored from")
        if len(s.response_mask) != n or (s.rollout_log_probs and len(s.rollout_log_probs) < n):
            raise ValueError(f"sample {i}: response_mask has {len(s.response_mask)} and rollout_log_probs "
                             f"{len(s.rollout_log_probs)} entries for {n} response_ids")
        tail = width - p - n
        ids.append(s.prompt_ids + s.response_ids + [pad_id] * tail)
        attn.append([1] * (p + n) + [0] * tail)
        resp.append([0] * (p - 1) + list(s.response_mask) + [0] * tail)
        lps = s.rollout_log_probs[:n] if s.rollout_log_probs else [0.0] * n
        rlp.append([0.0] * (p - 1) + list(lps) + [0.0] * tail)
    ids = torch.tensor(ids, dtype=torch.long, device="cpu")
    attn = torch.tensor(attn, dtype=torch.long, device="cpu")
    resp = torch.tensor(resp, dtype=torch.bool, device="cpu")
    rlp = torch.tensor(rlp, dtype=torch.float32, device="cpu")
    return ids, attn, resp, rlp


def pack_batch(batch: Batch, pad_id: int, *, overlong_filter: bool) -> None:
    """Fill the padded tensor fields and the loss mask of a scored batch, in place.

    The loss mask is the response mask of the samples that train: those with a valid reward, and with
    `overlong_filter` (DAPO) only those that finished.
    """
    batch.input_ids, batch.attention_mask, batch.response_mask, batch.rollout_log_probs = pack(batch.samples, pad_id)
    batch.finished = torch.tensor([s.finished for s in batch.samples], device="cpu")
    keep = batch.valid.clone()
    if overlong_filter:
        keep &= batch.finished
    batch.loss_mask = batch.response_mask & keep[:, None]
    batch.kept_threshold = pack_kept_thresholds(batch.samples, batch.input_ids.shape[1])
    batch.routed_experts = pack_routed_experts(batch.samples, batch.input_ids.shape[1])


def pack_routed_experts(samples: list[Sample], width: int) -> torch.Tensor | None:
    """[B, width - 1, n_layers, k] int16 label-aligned routing of samples that recorded it (`Sample.routed_experts`),
    -1 elsewhere; None when no sample did."""
    records = [getattr(s, "routed_experts", None) for s in samples]
    first = next((r for r in records if r is not None), None)
    if first is None:
        return None
    from credo.moe import pack_routing

    return pack_routing(records, width, tuple(first.shape[1:]))


def pack_kept_thresholds(samples: list[Sample], width: int) -> torch.Tensor | None:
    """[B, width - 1] float32 label-aligned kept-set thresholds of samples that recorded them (`Sample.kept_thresholds`),
    -inf elsewhere; None when no sample did."""
    if not any(s.kept_thresholds for s in samples):
        return None
    rows = []
    for s in samples:
        p, n, taus = len(s.prompt_ids), len(s.response_ids), s.kept_thresholds or []
        lead = [-math.inf] * (p - 1) + list(taus[:n]) + [-math.inf] * (n - min(n, len(taus)))
        rows.append(lead + [-math.inf] * (width - 1 - len(lead)))
    return torch.tensor(rows, dtype=torch.float32)
