"""The RL trainer: one step is a page of plain calls.

    rollout -> rewards -> advantages -> recompute log-probs -> loss -> optimizer step -> weight sync

Every loss, advantage estimator and KL estimator comes from `credo.algos` by the name the recipe gives.
The same code runs as one process or data-parallel under `torchrun` / the `deepspeed` launcher: each rank
rolls out its shard of the step's prompts (all G responses of a prompt stay on one rank), advantages
are computed on the gathered batch, and losses are normalised by global token/sequence counts so the
update does not depend on the micro-batch or rank split.

Extension points (see docs/architecture.md): `Sample.response_mask` (multi-turn observation tokens),
`policy_forward` (attention statistics during the log-prob recompute), `Sample.policy_version`
(asynchronous rollout and staleness), `compute_advantages` (critics), `save_checkpoint`/`load_checkpoint`
(rollback of the full trainer state).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from credo import algos
from credo.checkpoint import (find_resume_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint,
                             verify_checkpoint)
from credo.config import ConfigError, Recipe, recipe_to_dict, recipe_to_yaml
from credo.distributed.engine import all_gather_cat, all_reduce_sum, barrier, build_engine, device, setup_distributed
from credo.distributed.rollout import HFBackend, Sample
from credo.models import check_vocab, load_causal_lm, load_tokenizer, resolve_model_path
from credo.rewards.tasks import make_task
from credo.rewards.worker import RewardWorker, import_reward_fn, per_sample
from credo.tracking import Tracker, truncate_metrics

log = logging.getLogger("credo")


class TrainingError(RuntimeError):
    """The run cannot continue (repeated non-finite steps, broken reward function, bad input)."""


# ------------------------------------------------------------------------------------------- batching


@dataclass
class Batch:
    """Padded tensors for one rank's samples. Label-aligned: column j scores token j+1 of input_ids."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L-1] bool: response tokens (mask 1) of valid samples
    rollout_log_probs: torch.Tensor  # [B, L-1]
    advantages: torch.Tensor  # [B, L-1]


def pack(samples: list[Sample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad prompt+response; return input_ids, attention_mask, response mask and sampler log-probs."""
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
    ids = torch.tensor(ids, dtype=torch.long)
    attn = torch.tensor(attn, dtype=torch.long)
    resp = torch.tensor(resp, dtype=torch.bool)
    rlp = torch.tensor(rlp, dtype=torch.float32)
    return ids, attn, resp, rlp


def policy_forward(model, input_ids, attention_mask, token_mask, *, temperature: float, chunk_size: int,
                   with_entropy: bool, hidden_path: bool = True):
    """Log-probs (and entropy) of input_ids[:, 1:] at `token_mask` positions, as [B, L-1] tensors.

    Takes the last hidden layer and computes log-softmax only on the selected rows with
    `credo.algos.logprobs_from_hidden`, so the [N, V] logits are never held at once. This is the
    place to capture attention statistics during the recompute (e.g. forward hooks on attention
    modules feeding `credo.credit`), since it is the one forward over the training tokens.
    """
    B, T = token_mask.shape
    zero = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    if hidden_path:
        base = getattr(model, model.base_model_prefix)
        hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        head = model.get_output_embeddings()
        rows = hidden[token_mask]
        labels = input_ids[:, 1:][token_mask]
        out = algos.logprobs_from_hidden(rows, head.weight, labels, temperature=temperature, chunk_size=chunk_size,
                                         with_entropy=with_entropy, bias=getattr(head, "bias", None))
        lp_rows, ent_rows = (out if with_entropy else (out, None))
    else:  # ZeRO-3 partitions the head weight; let the model's own forward gather it
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        sel = logits[token_mask].float() / temperature  # response rows only, before any fp32 copy
        logp = sel.log_softmax(-1)
        lp_rows = logp.gather(-1, input_ids[:, 1:][token_mask].unsqueeze(-1)).squeeze(-1)
        ent_rows = algos.entropy_from_logits(sel) if with_entropy else None
    log_probs = zero.masked_scatter(token_mask, lp_rows.float())
    entropy = zero.masked_scatter(token_mask, ent_rows.float()) if ent_rows is not None else None
    return log_probs, entropy


# ------------------------------------------------------------------------------------------ advantages

def is_outcome_estimator(name: str) -> bool:
    return algos.ADVANTAGE_INPUTS.get(name) == "outcome"


def compute_advantages(name: str, kwargs: dict, rewards: torch.Tensor, group_ids: torch.Tensor,
                       n_tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Sequence advantages [B] over the whole (gathered) batch.

    `n_tokens [B]` are the loss tokens per sample: token-weighted estimators (REINFORCE++ whitening)
    see each sample with its real length. Invalid samples (failed reward calls) get 0 and no say in
    the group or batch statistics.
    """
    adv = torch.zeros_like(rewards)
    if valid.any():
        fn = algos.ADVANTAGE_ESTIMATORS[name]
        lens = n_tokens[valid].long().clamp_min(1)
        mask = torch.arange(int(lens.max()))[None, :] < lens[:, None]
        adv[valid] = fn(rewards[valid], group_ids[valid], mask, **kwargs)[:, 0]
    return adv


# --------------------------------------------------------------------------------------------- trainer


def _step_seed(seed: int, step: int, salt: int) -> int:
    h = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def step_problem_indices(seed: int, step: int, n_problems: int, prompts_per_step: int) -> list[int]:
    """The training problems of `step` (all ranks), deterministic in seed and step."""
    gen = torch.Generator().manual_seed(_step_seed(seed, step, 0))
    return torch.randint(0, n_problems, (prompts_per_step,), generator=gen).tolist()


def grad_accum_steps(local_samples: int, mini_batches: int, micro_batch_size: int) -> int:
    """Micro-batches per optimizer step for one rank's `local_samples` split into `mini_batches`."""
    mini = math.ceil(local_samples / mini_batches)
    return min(math.ceil(mini / micro_batch_size), mini)


class Trainer:
    def __init__(self, r: Recipe):
        self.r = r
        self.rank, self.world = setup_distributed()
        threads = r.run.threads or max(1, (os.cpu_count() or 1) // self.world)
        torch.set_num_threads(threads)
        if r.rollout.prompts_per_step % self.world:
            raise ConfigError(f"config key 'rollout.prompts_per_step' = {r.rollout.prompts_per_step} must be divisible "
                              f"by the number of processes ({self.world})")
        if not is_outcome_estimator(r.algo.advantage):
            raise ConfigError(f"config key 'algo.advantage' = '{r.algo.advantage}' needs per-token rewards or a value "
                              "model; this trainer takes outcome estimators (e.g. grpo, rloo, lite_ppo)")
        self.run_dir = self._run_dir()
        torch.manual_seed(r.run.seed)
        self.task = make_task(r.task)
        self.policy_path, self.sft_key = self._prepare_policy()
        self.tokenizer = load_tokenizer(self.policy_path)
        model = load_causal_lm(self.policy_path, r.model.dtype)
        check_vocab(model, self.tokenizer, self.policy_path)
        self._check_context(model)
        self.ref = None
        if r.model.ref_model:
            self.ref = load_causal_lm(self.policy_path, r.model.dtype).to(device()).eval().requires_grad_(False)
        local = r.rollout.prompts_per_step // self.world * r.rollout.group_size
        self.grad_accum = grad_accum_steps(local, r.algo.mini_batches, r.algo.micro_batch_size)
        self.engine = build_engine(
            model, lr=r.optim.lr, betas=r.optim.betas, weight_decay=r.optim.weight_decay, grad_clip=r.optim.grad_clip,
            zero_stage=r.optim.zero_stage, warmup_steps=r.optim.warmup_steps, micro_batch=r.algo.micro_batch_size,
            grad_accum=self.grad_accum, bf16=r.model.dtype == "bfloat16")
        self.backend = self._make_backend()
        fn = import_reward_fn(r.reward.function) if r.reward.function else per_sample(self.task.score)
        self.rewards = RewardWorker(fn, timeout_s=r.reward.timeout_s, workers=r.reward.workers,
                                    max_failure_frac=r.reward.max_failure_frac)
        self.fault_nan_steps = fault_nan_steps()  # test hook, read once
        self.consecutive_skips = 0
        self.skipped_total = 0
        self.reward_failures_total = 0
        self.start_step = self._maybe_resume()
        if self.rank == 0:
            (self.run_dir / "config.yaml").write_text(recipe_to_yaml(r))
        wandb_cfg = {"project": r.run.wandb_project, "mode": r.run.wandb_mode} if r.run.wandb else None
        self.tracker = Tracker(self.run_dir, total_steps=r.run.steps, start_step=self.start_step, enabled=self.rank == 0,
                               progress=r.run.progress, plot=r.run.plot, wandb_cfg=wandb_cfg, config=recipe_to_dict(r))
        # Everything built so far (models, engines, the modules of torch, transformers and DeepSpeed) lives for
        # the whole run: move it out of the collector's reach, as vLLM does after start-up. Otherwise each
        # full collection walks it again; one took 0.27 s, longer than a quickstart step.
        gc.collect()
        gc.freeze()

    # ---- setup helpers
    def _run_dir(self) -> Path:
        r = self.r
        path = [r.run.output_dir or os.path.join("runs", r.run.name, time.strftime("%Y%m%d-%H%M%S"))]
        if self.world > 1:
            dist.broadcast_object_list(path, src=0)
        run_dir = Path(path[0])
        previous = [p.name for p in (run_dir / "metrics.jsonl", *list_checkpoints(run_dir / "checkpoints")) if p.exists()]
        if previous and not r.run.resume:  # a fresh run here would append to its metrics and prune its checkpoints
            raise ConfigError(f"config key 'run.output_dir' = '{run_dir}' already holds a run ({', '.join(previous)}); "
                              "expected run.resume=auto to continue it, or a new run.output_dir")
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        return run_dir

    def _prepare_policy(self) -> tuple[str, str | None]:
        r = self.r
        out: list = [None, None]
        if self.rank == 0:
            base = resolve_model_path(r.model.path, r.model.tiny)
            if r.sft.enabled and r.sft.steps > 0:
                from credo.sft import run_sft

                out = list(run_sft(r, base, self.task, log=lambda m: log.info(m)))
            else:
                out = [base, None]
        if self.world > 1:
            dist.broadcast_object_list(out, src=0)
        return out[0], out[1]

    def _check_context(self, model) -> None:
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is None:
            return
        longest, where = 0, None
        for i, p in enumerate(self.task.eval_problems()[:1000]):
            n = len(self.tokenizer(p.prompt, add_special_tokens=False)["input_ids"])
            if n > longest:
                longest, where = n, f"eval problem {i}"
        for i in range(min(len(self.task), 2000)):
            n = len(self.tokenizer(self.task.train(i).prompt, add_special_tokens=False)["input_ids"])
            if n > longest:
                longest, where = n, f"train problem {i}"
        if longest + self.r.rollout.max_new_tokens > limit:
            raise ConfigError(
                f"prompt too long: {where} has {longest} tokens + rollout.max_new_tokens={self.r.rollout.max_new_tokens}"
                f" > the model's context of {limit} tokens (max_position_embeddings); shorten prompts or max_new_tokens")

    def _make_backend(self):
        r = self.r
        if r.rollout.backend == "hf":
            return HFBackend(self.engine.module, self.tokenizer, max_batch=r.rollout.hf_max_batch)
        from credo.distributed.vllm_backend import VLLMBackend

        eager = r.rollout.vllm_enforce_eager
        backend = VLLMBackend(self.policy_path, dtype=r.model.dtype, seed=r.run.seed, kv_cache_gib=r.rollout.vllm_kv_cache_gib,
                              gpu_memory_utilization=r.rollout.vllm_gpu_memory_utilization,
                              enforce_eager=(not torch.cuda.is_available()) if eager is None else eager)
        return backend

    def _maybe_resume(self) -> int:
        spec = self.r.run.resume
        if not spec:
            return 0
        ckpt_root = self.run_dir / "checkpoints"
        if spec == "auto":
            # rank 0 verifies (and sets corrupt folders aside) once; every rank loads the folder it chose
            found = [find_resume_checkpoint(ckpt_root, tidy=True) if self.rank == 0 else None]
            if self.world > 1:
                dist.broadcast_object_list(found, src=0)
            path = found[0]
        else:
            path = Path(spec)
            problem = "the folder does not exist" if not path.is_dir() else verify_checkpoint(path)
            if problem is not None:
                raise ConfigError(f"config key 'run.resume' = '{spec}': not a usable checkpoint ({problem}); "
                                  "expected 'auto' or a checkpoints/step_<N> folder")
        if path is None:
            log.warning("run.resume=auto: no usable checkpoint in %s; starting from step 0", ckpt_root)
            if self.rank == 0:
                truncate_metrics(self.run_dir / "metrics.jsonl", -1)
            return 0
        meta = load_checkpoint(self.engine, path, verify=False)
        if meta.get("sft_key") != self.sft_key:
            raise ConfigError(f"checkpoint {path} was trained from a different warm-up (sft_key {meta.get('sft_key')} "
                              f"!= {self.sft_key}); resume with the recipe it was made with")
        counters = meta.get("counters", {})
        self.consecutive_skips = counters.get("consecutive_skips", 0)
        self.skipped_total = counters.get("skipped_total", 0)
        self.reward_failures_total = counters.get("reward_failures_total", 0)
        self.backend.sync_weights(self.engine.module, meta["step"])
        if self.rank == 0:
            truncate_metrics(self.run_dir / "metrics.jsonl", meta["step"])
        log.info("resumed from %s (step %d)", path, meta["step"])
        return meta["step"]

    # ---- the step
    def rollout(self, step: int):
        """This rank's prompts for `step` (deterministic in seed and step) and their G responses."""
        r = self.r
        P, G = r.rollout.prompts_per_step, r.rollout.group_size
        idx = step_problem_indices(r.run.seed, step, len(self.task), P)
        per_rank = P // self.world
        mine = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))
        problems = [self.task.train(idx[i]) for i in mine]
        prompt_ids = self.tokenizer([p.prompt for p in problems], add_special_tokens=False)["input_ids"]
        prompts = [ids for ids in prompt_ids for _ in range(G)]
        seeds = [_step_seed(r.run.seed, step, 1 + i * G + g) for i in mine for g in range(G)]
        samples = self.backend.generate(prompts, max_new_tokens=r.rollout.max_new_tokens, temperature=r.rollout.temperature,
                                        top_p=r.rollout.top_p, seeds=seeds)
        group_ids = torch.tensor([i for i in mine for _ in range(G)])
        return problems, samples, group_ids

    def score(self, problems, samples, step: int):
        G = self.r.rollout.group_size
        texts = self.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
        groups = [(texts[i * G:(i + 1) * G], [p] * G) for i, p in enumerate(problems)]
        res = self.rewards(groups, step=step)
        return torch.tensor(res.rewards), torch.tensor(res.valid), res

    def update(self, batch: Batch, old_log_probs: torch.Tensor | None, ref_log_probs: torch.Tensor | None, step: int):
        """Mini-batch / micro-batch loop; returns metrics. Skips the optimizer step on non-finite loss or grads."""
        r, a = self.r, self.r.algo
        B = batch.input_ids.shape[0]
        engine = self.engine
        loss_fn = algos.POLICY_LOSSES[a.policy_loss]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        skipped = 0
        zero0_norm = float("nan")  # the norm this loop checks on ZeRO-0, where DeepSpeed reports none
        for epoch in range(a.ppo_epochs):
            for mb in torch.arange(B).tensor_split(a.mini_batches):
                mb_mask = batch.loss_mask[mb]
                gt, gs = all_reduce_sum(torch.stack([mb_mask.sum(), (mb_mask.sum(-1) > 0).sum()])).clamp_min(1)
                bad = None
                for micro in mb.tensor_split(self.grad_accum):
                    m = batch.loss_mask[micro]
                    lp, ent = policy_forward(engine.module, batch.input_ids[micro], batch.attention_mask[micro], m,
                                             temperature=r.rollout.temperature, chunk_size=a.logprob_chunk_size,
                                             with_entropy=True, hidden_path=r.optim.zero_stage < 3)
                    old = lp.detach() if old_log_probs is None else old_log_probs[micro]
                    agg = dict(global_tokens=gt, global_seqs=gs, norm_len=r.rollout.max_new_tokens)
                    pg, metrics = loss_fn(lp, old, batch.advantages[micro], m, agg_mode=a.agg_mode,
                                          rollout_log_probs=batch.rollout_log_probs[micro], **agg, **a.loss_kwargs)
                    ent_term = algos.aggregate(ent.detach() if a.entropy_coef == 0 else ent, m, a.agg_mode, **agg)
                    loss = pg - a.entropy_coef * ent_term
                    kl_term = None
                    if ref_log_probs is not None:
                        kl = algos.KL_ESTIMATORS[a.kl_estimator](lp, ref_log_probs[micro])
                        kl_term = algos.aggregate(kl, m, a.agg_mode, **agg)
                        loss = loss + a.kl_coef * kl_term
                    if step in self.fault_nan_steps:
                        loss = loss * float("nan")
                    if not torch.isfinite(loss):
                        bad = bad or "loss"
                        # poison every gradient so the step is skipped as a whole, whichever ZeRO stage runs
                        loss = sum(p.sum() for p in engine.module.parameters() if p.requires_grad) * float("nan")
                    # the loss is already normalised by global counts: no 1/grad_accum, and undo DP averaging
                    engine.backward(loss * self.world, scale_wrt_gas=False)
                    nonfinite = False
                    if engine.is_gradient_accumulation_boundary() and r.optim.zero_stage == 0:
                        zero0_norm = _grad_norm(engine.module)
                        nonfinite = not math.isfinite(zero0_norm)
                    if nonfinite:
                        bad = bad or "grad_norm"
                        _step_without_update(engine)  # ZeRO-0 has no overflow check of its own
                    else:
                        engine.step()
                    for k, v in {"train/pg_loss": pg, "train/entropy": ent_term, "train/kl": kl_term}.items():
                        if v is not None:
                            sums[k] = sums.get(k, 0.0) + float(v.detach())
                            counts[k] = 1
                    for k, v in metrics.items():
                        sums[f"loss/{k}"] = sums.get(f"loss/{k}", 0.0) + float(v)
                        counts[f"loss/{k}"] = counts.get(f"loss/{k}", 0) + 1
                applied = engine.was_step_applied() and bad is None
                if not applied:
                    skipped += 1
                    log.error("step %d: optimizer step skipped, non-finite %s", step, bad or "grad_norm")
        out = {}
        totals = all_reduce_sum(torch.tensor(list(sums.values()), dtype=torch.float64)).tolist()
        for k, total in zip(sums, totals):
            # loss pieces are sums of globally normalised parts (divide by passes); loss metrics are means
            out[k] = total / (a.ppo_epochs * a.mini_batches) if counts[k] == 1 else total / (counts[k] * self.world)
        out["train/loss"] = out.get("train/pg_loss", 0.0) - a.entropy_coef * out.get("train/entropy", 0.0) + \
            a.kl_coef * out.get("train/kl", 0.0)
        norm = engine.get_global_grad_norm()  # None on ZeRO-0 with a torch optimizer: use the norm checked above
        out["train/grad_norm"] = float(norm) if norm is not None else zero0_norm
        out["train/skipped_steps"] = skipped
        return out, skipped

    def train_step(self, step: int) -> dict:
        r = self.r
        t0 = time.perf_counter()
        problems, samples, group_ids = self.rollout(step)
        t_roll = time.perf_counter()
        rewards, valid, res = self.score(problems, samples, step)
        t_rew = time.perf_counter()
        ids, attn, resp, rlp = pack(samples, self.tokenizer.pad_token_id)
        keep = valid.clone()
        finished = torch.tensor([s.finished for s in samples])
        if r.algo.overlong_filter:
            keep &= finished
        loss_mask = resp & keep[:, None]
        rew_all, val_all = all_gather_cat(rewards), all_gather_cat(valid)
        adv_seq = compute_advantages(r.algo.advantage, r.algo.advantage_kwargs, rew_all, all_gather_cat(group_ids),
                                     all_gather_cat(resp.sum(-1)), val_all)
        B = len(samples)
        adv_seq = adv_seq[self.rank * B:(self.rank + 1) * B]
        dev = device()
        batch = Batch(ids.to(dev), attn.to(dev), loss_mask.to(dev), rlp.to(dev),
                      (adv_seq[:, None].expand_as(rlp) * loss_mask).to(dev))
        old_lp = ref_lp = None
        with torch.no_grad():
            if r.algo.ppo_epochs * r.algo.mini_batches > 1:  # off-policy passes need pi_old from before the update
                old_lp, _ = policy_forward(self.engine.module, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                           temperature=r.rollout.temperature, chunk_size=r.algo.logprob_chunk_size,
                                           with_entropy=False, hidden_path=r.optim.zero_stage < 3)
            if self.ref is not None:
                ref_lp, _ = policy_forward(self.ref, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                           temperature=r.rollout.temperature, chunk_size=r.algo.logprob_chunk_size,
                                           with_entropy=False)
        t_lp = time.perf_counter()
        metrics, skipped = self.update(batch, old_lp, ref_lp, step)
        t_upd = time.perf_counter()
        self.backend.sync_weights(self.engine.module, step)
        t_sync = time.perf_counter()

        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        self.skipped_total += skipped
        if self.consecutive_skips >= r.run.max_consecutive_skips:
            raise TrainingError(f"{self.consecutive_skips} consecutive optimizer steps skipped for non-finite values "
                                f"(run.max_consecutive_skips={r.run.max_consecutive_skips}); stopping at step {step}")
        n_tok = all_reduce_sum(attn.sum()).item()
        fails, timeouts = (int(v) for v in all_reduce_sum(torch.tensor([res.failures + res.timeouts, res.timeouts])))
        self.reward_failures_total += fails
        lengths = all_gather_cat(torch.tensor([float(len(s.response_ids)) for s in samples]))
        elapsed = t_sync - t0
        row = {
            "step": step,
            "train/reward_mean": float(rew_all[val_all].mean()) if val_all.any() else float("nan"),
            "train/reward_std": float(rew_all[val_all].std()) if val_all.sum() > 1 else 0.0,
            **metrics,
            "train/response_len": float(lengths.mean()),
            "train/truncated_frac": float(1 - all_gather_cat(finished.float()).mean()),
            "train/reward_failures": fails,
            "train/reward_timeouts": timeouts,
            "train/skipped_total": self.skipped_total,
            "train/lr": self.engine.get_lr()[0],
            "perf/rollout_s": t_roll - t0,
            "perf/reward_s": t_rew - t_roll,
            "perf/logprob_s": t_lp - t_rew,
            "perf/update_s": t_upd - t_lp,
            "perf/sync_s": t_sync - t_upd,
            "perf/train_s": t_upd - t_rew,
            "perf/step_time_s": elapsed,
            "perf/tokens_per_s": n_tok / elapsed / self.world,
            "perf/peak_rss_gb": _peak_rss_gb(),
        }
        return row

    def evaluate(self) -> float:
        """Accuracy on the held-out split (sharded over ranks): greedy, or the mean over `eval_samples`
        samples at `eval_temperature` with fixed seeds, so every evaluation sees the same random draws."""
        r = self.r
        problems = self.task.eval_problems()[self.rank::self.world]
        k = r.run.eval_samples
        prompts = [ids for ids in self.tokenizer([p.prompt for p in problems], add_special_tokens=False)["input_ids"]
                   for _ in range(k)]
        greedy = r.run.eval_temperature == 0
        seeds = None if greedy else [_step_seed(r.run.seed, -1, self.rank * len(prompts) + i) for i in range(len(prompts))]
        samples = self.backend.generate(prompts, max_new_tokens=r.rollout.max_new_tokens,
                                        temperature=1.0 if greedy else r.run.eval_temperature, top_p=1.0, seeds=seeds)
        texts = self.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
        correct = 0.0
        for i, text in enumerate(texts):
            try:
                correct += self.task.score(text, problems[i // k])
            except Exception:  # noqa: BLE001 - a verifier crash on one answer scores it 0
                pass
        tot = all_reduce_sum(torch.tensor([correct, float(len(samples))], dtype=torch.float64))
        return float(tot[0] / tot[1])

    def checkpoint(self, step: int) -> None:
        digests = param_digests(self.engine.module)
        if len(set(digests)) > 1:
            raise TrainingError(f"data-parallel ranks hold different parameters at step {step}: {digests}")
        meta = {"data_position": step, "sft_key": self.sft_key, "policy_path": self.policy_path, "param_digests": digests,
                "counters": {"consecutive_skips": self.consecutive_skips, "skipped_total": self.skipped_total,
                             "reward_failures_total": self.reward_failures_total}}
        saved = save_checkpoint(self.engine, self.run_dir / "checkpoints", step, meta=meta, keep_last=self.r.run.keep_last)
        if saved is None:  # the model holds NaN/Inf: training on is pointless, the last checkpoint is still good
            raise TrainingError(f"the model holds non-finite parameters at step {step}; no checkpoint written. "
                                "Resume from the last checkpoint (run.resume=auto) with a lower optim.lr")

    def fit(self) -> Path:
        r = self.r
        try:
            if self.start_step == 0 and r.run.eval_every:
                self.tracker.log({"step": 0, "eval/accuracy": self.evaluate()})
            for step in range(self.start_step + 1, r.run.steps + 1):
                row = self.train_step(step)
                if r.run.eval_every and (step % r.run.eval_every == 0 or step == r.run.steps):
                    row["eval/accuracy"] = self.evaluate()
                self.tracker.log(row)
                if step == r.run.steps or (r.run.save_every and step % r.run.save_every == 0):
                    self.checkpoint(step)
        finally:
            self.tracker.close()
            self.rewards.close()
        barrier()
        return self.run_dir

    def close(self) -> None:
        self.backend.close()
        self.rewards.close()
        gc.unfreeze()  # let a process that goes on (tests, notebooks) collect this trainer


def param_digests(module: torch.nn.Module) -> list[str]:
    """SHA-256 of this rank's parameters, gathered from every rank (data-parallel replicas must agree)."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    out = [h.hexdigest()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, h.hexdigest())
    return out


def _step_without_update(engine) -> None:
    """`engine.step()` that moves no weight, optimizer moment or LR: DeepSpeed's overflow skip, for ZeRO-0.

    The gradients are dropped (torch optimizers pass over parameters without one), clipping is off for the
    call (it fails on no gradients), and the optimizer reports an overflow, so DeepSpeed counts a skipped
    step and holds the LR schedule as ZeRO-1/2/3 do, while its micro-step counters advance as usual.
    """
    for p in engine.module.parameters():
        p.grad = None
    opt, cfg = engine.optimizer, engine._config
    clip, had, overflow = cfg.gradient_clipping, hasattr(opt, "overflow"), getattr(opt, "overflow", None)
    cfg.gradient_clipping, opt.overflow = 0.0, True
    try:
        engine.step()
    finally:
        cfg.gradient_clipping = clip
        if had:
            opt.overflow = overflow
        else:
            del opt.overflow


def _grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _peak_rss_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def fault_nan_steps() -> set[int]:
    """Test hook: CREDO_FAULT_NAN_STEP=N (or `2,5` or `3-6`) forces the loss of those steps to NaN."""
    steps: set[int] = set()
    for part in filter(None, os.environ.get("CREDO_FAULT_NAN_STEP", "").replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        steps.update(range(int(lo), int(hi or lo) + 1))
    return steps


def train(r: Recipe) -> Path:
    trainer = Trainer(r)
    try:
        return trainer.fit()
    finally:
        trainer.close()
