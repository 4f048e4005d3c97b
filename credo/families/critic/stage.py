"""The critic advantage stage: PPO with value models (GAE), and AsyPPO's mini-critics (arXiv 2510.01656).

    values  [M, B, T]  each critic on the batch, before its update (standard PPO; label-aligned:
                       column j is V of the state that generates token j+1, as log-prob column j)
    rewards [B, T]     outcome reward on each sample's last response token
                       (- kl_in_reward * (log pi - log pi_ref) on every response token, if set)
    GAE on the critics' mean (or min) value -> batch.advantages (x loss_mask; optional whitening), batch.values
    critic m trains on its shard (`credo.algos.critic_shards`: rank in group mod M) against the GAE returns,
                       with `credo.algos.value_loss` (clipped around the rollout-time values), for `epochs`
                       passes of `mini_batches` optimizer steps on its own DeepSpeed engine
    AsyPPO (low_frac / high_frac > 0): `credo.algos.asyppo_masks` over the global batch ->
                       adv_keep multiplies batch.weights (the policy-gradient term),
                       entropy_keep is batch.entropy_mask (the entropy bonus)

The stage owns the critics' engines: `state_dict` / `load_state_dict` copy them in memory (rollback),
`save_files` / `load_files` write and read them as DeepSpeed checkpoints inside the trainer's checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from credo import algos
from credo.distributed.engine import (all_reduce_max, all_reduce_sum, backward, device, engine_state_dict,
                                      load_engine_state_dict, optimizer_step, param_digests, rank_and_world,
                                      reapply_optimizer_settings)
from credo.train.advantage import gather_rows
from credo.train.batch import Batch

CKPT_TAG = "state"


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sparse token rewards: each sample's outcome reward on its last masked token.

    Args:
        rewards: [B] float. mask: [B, T] bool (rows without a masked token get no reward).
    Returns:
        [B, T] float32.
    """
    B, T = mask.shape
    last = T - 1 - mask.flip(-1).int().argmax(-1)  # index of the last True
    out = torch.zeros(B, T, dtype=torch.float32, device=mask.device)
    has = mask.any(-1)
    out[torch.arange(B, device=mask.device)[has], last[has]] = rewards.to(out)[has]
    return out


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the masked entries of every rank (unbiased variance, as verl); 0 off the mask."""
    m = mask.to(x.dtype)
    n, s, s2 = all_reduce_sum(torch.stack([m.sum(), (x * m).sum(), (x * x * m).sum()]).double()).tolist()
    if n < 2:
        return x * m
    mean = s / n
    var = (s2 - n * mean * mean) / (n - 1)
    return (x - mean) / (max(var, 0.0) + 1e-8) ** 0.5 * m


class PolicyKL:
    """log pi and log pi_ref on a batch's response tokens, for KL-in-reward (one extra policy forward)."""

    def __init__(self, scorer, engine, ref_model):
        self.scorer, self.engine, self.ref_model = scorer, engine, ref_model

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, T] log pi - log pi_ref (k1), 0 off `mask`."""
        lp, _ = self.scorer(self.engine.module, ids, attn, mask, with_entropy=False)
        ref, _ = self.scorer(self.ref_model, ids, attn, mask, with_entropy=False, hidden_path=True)
        return lp - ref


class CriticAdvantage:
    """GAE advantages from M value models, which it trains on the same batch (see the module docstring).

    Args:
        engines: the critics' DeepSpeed engines (each `engine.module` a `ValueModel`).
        gae_kwargs: `credo.algos.gae` keywords (gamma, lam) from algo.advantage_kwargs.
        grad_accum: micro-batches per critic optimizer step (the engines' gradient_accumulation_steps).
        kl: a `PolicyKL`, or None without KL-in-reward.
    """

    def __init__(self, engines: list, *, gae_kwargs: dict, value_agg: str, whiten: bool, kl_in_reward: float,
                 kl: Callable | None, low_frac: float, high_frac: float, value_clip: float | None, epochs: int,
                 mini_batches: int, micro_batch_size: int, grad_accum: int, critic_only_steps: int,
                 zero_stage: int, world: int):
        self.engines, self.gae_kwargs, self.value_agg = engines, dict(gae_kwargs), value_agg
        self.whiten, self.kl_in_reward, self.kl = whiten, kl_in_reward, kl
        self.low_frac, self.high_frac, self.value_clip = low_frac, high_frac, value_clip
        self.epochs, self.mini_batches, self.micro = epochs, mini_batches, micro_batch_size
        self.grad_accum, self.critic_only_steps = grad_accum, critic_only_steps
        self.zero_stage, self.world = zero_stage, world

    # ------------------------------------------------------------------------------------ the step
    def __call__(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        dev = device()
        ids, attn = batch.input_ids.to(dev), batch.attention_mask.to(dev)
        loss_mask = batch.loss_mask.to(dev)
        mask = batch.response_mask.to(dev) & batch.valid.to(dev)[:, None]  # tokens the critics fit
        values = self.values(ids, attn, mask)  # [M, B, T]
        vbar = values.mean(0) if self.value_agg == "mean" else values.min(0).values
        rewards = outcome_token_rewards(batch.rewards.to(dev), mask)
        if self.kl_in_reward:
            rewards = rewards - self.kl_in_reward * self.kl(ids, attn, mask) * mask
        adv, returns = algos.gae(rewards, vbar, mask, **self.gae_kwargs)
        adv = whiten(adv, loss_mask) if self.whiten else adv * loss_mask
        metrics = {"critic/explained_variance": explained_variance(returns, vbar, mask),
                   "critic/value_mean": masked_global_mean(vbar, mask),
                   "critic/return_mean": masked_global_mean(returns, mask),
                   "critic/sigma_mean": masked_global_mean(values.float().std(0, unbiased=False), mask)}
        if self.low_frac or self.high_frac:
            adv_keep, ent_keep = self.masks(values, loss_mask)
            n = max(1.0, float(all_reduce_sum(loss_mask.sum().double())))
            metrics["asyppo/adv_masked_frac"] = float(all_reduce_sum((loss_mask & ~adv_keep).sum().double())) / n
            metrics["asyppo/entropy_filtered_frac"] = float(all_reduce_sum((loss_mask & ~ent_keep).sum().double())) / n
            keep = adv_keep.float().cpu()
            batch.weights = keep if batch.weights is None else batch.weights * keep
            batch.entropy_mask = ent_keep.cpu()
        metrics.update(self.update(ids, attn, mask, values, returns, batch.group_ids))
        batch.values, batch.advantages = vbar.cpu(), adv.cpu()
        batch.train_policy = batch.step > self.critic_only_steps
        batch.metrics.update(metrics)
        batch.metrics["perf/critic_s"] = time.perf_counter() - t0

    @torch.no_grad()
    def values(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[M, B, T] float32 values of every critic, 0 off `mask`, in micro-batches."""
        rows = torch.arange(ids.shape[0], device=ids.device).split(self.micro)
        return torch.stack([torch.cat([e.module(ids[r], attn[r]) for r in rows]) * mask for e in self.engines])

    def masks(self, values: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """AsyPPO's (adv_keep, entropy_keep) [B, T] for this rank's rows, quantiles over every rank's tokens."""
        rank, _ = rank_and_world()
        B, T = loss_mask.shape
        width = int(all_reduce_max(torch.tensor(T, device="cpu")))
        all_values = torch.stack([gather_rows(v, width) for v in values])
        all_mask = gather_rows(loss_mask, width)
        adv_keep, ent_keep = algos.asyppo_masks(all_values, all_mask, self.low_frac, self.high_frac)
        return adv_keep[rank * B:(rank + 1) * B, :T], ent_keep[rank * B:(rank + 1) * B, :T]

    def update(self, ids, attn, mask, old_values, returns, group_ids) -> dict[str, float]:
        """Train critic m on its shard; returns the step's critic metrics (means over critics and passes)."""
        shards = algos.critic_shards(group_ids, len(self.engines)).to(ids.device)
        sums = torch.zeros(3, dtype=torch.float64, device="cpu")  # loss, clipped tokens, tokens (host)
        norms = []
        for m, engine in enumerate(self.engines):
            rows = (shards == m).nonzero().squeeze(1)
            for _ in range(self.epochs):
                for mb in rows.tensor_split(self.mini_batches):
                    mb_mask = mask[mb]
                    gt, gs = all_reduce_sum(torch.stack([mb_mask.sum(), (mb_mask.sum(-1) > 0).sum()])).clamp_min(1)
                    for micro in mb.tensor_split(self.grad_accum):
                        # every rank takes grad_accum micro-steps per optimizer step; an empty part runs
                        # one sample at weight 0 so DeepSpeed's accumulation boundary and reductions line up
                        scale = 1.0 if len(micro) else 0.0
                        micro = micro if len(micro) else rows[:1]
                        v = engine.module(ids[micro], attn[micro])
                        loss, met = algos.value_loss(v, old_values[m, micro], returns[micro], mask[micro],
                                                     clip_range=self.value_clip, global_tokens=gt, global_seqs=gs)
                        backward(engine, loss * scale, self.world)
                        optimizer_step(engine, self.zero_stage)
                        n_tok = float(mask[micro].sum()) * scale
                        sums += torch.tensor([float(loss.detach()) * scale, float(met["vf_clipfrac"]) * n_tok, n_tok],
                                             dtype=torch.float64, device="cpu")
                    norm = engine.get_global_grad_norm()
                    if norm is not None:
                        norms.append(float(norm))
        loss_sum, clipped, tokens = all_reduce_sum(sums).tolist()
        steps = len(self.engines) * self.epochs * self.mini_batches
        out = {"critic/value_loss": loss_sum / steps, "critic/vf_clipfrac": clipped / max(tokens, 1.0)}
        if norms:
            out["critic/grad_norm"] = sum(norms) / len(norms)
        return out

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """In-memory copies of every critic engine (weights, optimizer, LR schedule, counters)."""
        return {"critics": [engine_state_dict(e) for e in self.engines]}

    def load_state_dict(self, state: dict) -> None:
        for e, s in zip(self.engines, state["critics"], strict=True):
            load_engine_state_dict(e, s)

    def save_files(self, folder: Path) -> dict:
        """Collective: write each critic as a DeepSpeed checkpoint under folder/critic_<m>; returns the
        critics' parameter digests per rank (data-parallel replicas must agree)."""
        from credo.train.state import TrainingError

        digests = []
        for m, e in enumerate(self.engines):
            e.save_checkpoint(str(folder / f"critic_{m}"), tag=CKPT_TAG, save_latest=False)
            digests.append(param_digests(e.module))
            if len(set(digests[-1])) > 1:
                raise TrainingError(f"data-parallel ranks hold different parameters of critic {m}: {digests[-1]}")
        return {"param_digests": digests}

    def load_files(self, folder: Path) -> None:
        for m, e in enumerate(self.engines):
            path, _ = e.load_checkpoint(str(folder / f"critic_{m}"), tag=CKPT_TAG, load_optimizer_states=True,
                                        load_lr_scheduler_states=True)
            if path is None:
                raise RuntimeError(f"DeepSpeed could not load critic {m} from {folder / f'critic_{m}'}")
            reapply_optimizer_settings(e)  # the recipe's critic.lr, betas, weight decay


def masked_global_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    s, n = all_reduce_sum(torch.stack([(x.double() * mask).sum(), mask.sum().double()])).tolist()
    return s / n if n else 0.0


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens of every rank (nan if Var(returns) = 0)."""
    m, r, d = mask.double(), returns.double(), (returns - values).double()
    n, sr, sr2, sd, sd2 = all_reduce_sum(torch.stack([m.sum(), (r * m).sum(), (r * r * m).sum(), (d * m).sum(),
                                                      (d * d * m).sum()])).tolist()
    if n < 1:
        return float("nan")
    var_r, var_d = sr2 / n - (sr / n) ** 2, sd2 / n - (sd / n) ** 2
    return 1.0 - var_d / var_r if var_r > 1e-12 else float("nan")


def critic_stage(ctx, **kwargs) -> CriticAdvantage:
    """The advantage stage of an active critic family: `critic.num_critics` value models, each on its own DeepSpeed
    engine, behind a `CriticAdvantage` (GAE with algo.advantage_kwargs; AsyPPO with critic.low/high_frac)."""
    from credo.distributed.engine import build_engine
    from credo.errors import ConfigError
    from credo.families.critic.value_model import load_value_model
    from credo.models import resolve_model_path
    from credo.train.update import grad_accum_steps

    c, ro = ctx.section, ctx.rollout
    if kwargs or c is None or not c.num_critics:
        raise ConfigError("the critic advantage stage is chosen by critic.num_critics >= 1 (with algo.advantage: gae), "
                          "not by stages.advantage")
    path = ctx.policy_path if c.path is None else resolve_model_path(c.path, c.tiny)
    # the smallest shard a critic gets on one rank sets its micro-batches per optimizer step
    smallest_shard = ro["prompts_per_step"] // ctx.world * (ro["group_size"] // c.num_critics)
    grad_accum = grad_accum_steps(smallest_shard, c.mini_batches, c.micro_batch_size)
    engines = [build_engine(load_value_model(path, dtype=ctx.dtype, head_seed=ctx.seed * 1000 + m,
                                             actor_tokenizer=ctx.tokenizer, actor_path=ctx.policy_path),
                            lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, grad_clip=c.grad_clip,
                            zero_stage=ctx.zero_stage, warmup_steps=c.warmup_steps,
                            micro_batch=c.micro_batch_size, grad_accum=grad_accum, bf16=ctx.dtype == "bfloat16")
               for m in range(c.num_critics)]
    return CriticAdvantage(
        engines, gae_kwargs=ctx.advantage_kwargs, value_agg=c.value_agg, whiten=c.whiten,
        kl_in_reward=c.kl_in_reward, kl=PolicyKL(ctx.scorer, ctx.engine, ctx.ref_model) if c.kl_in_reward else None,
        low_frac=c.low_frac, high_frac=c.high_frac, value_clip=c.value_clip, epochs=c.epochs,
        mini_batches=c.mini_batches, micro_batch_size=c.micro_batch_size, grad_accum=grad_accum,
        critic_only_steps=c.critic_only_steps, zero_stage=ctx.zero_stage, world=ctx.world)
