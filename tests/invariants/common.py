"""Shared pieces of the train-step invariant tests: stages built from a recipe, a fixed batch, and a
naive reference of the whole objective and of the optimizer step, written independently of credo.

The reference differs from credo's code on purpose: logits come from the model's plain forward
(`model(...).logits`, not the chunked hidden-state path), every per-token term is computed in Python
loops from explicit formulas, aggregation is spelled out per mode, and AdamW, the warm-up schedule and
gradient clipping are written out by hand.
"""

from __future__ import annotations

import copy
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from credo.config import load_recipe
from credo.distributed.rollout import Sample
from credo.train.batch import Batch, pack_batch
from tests.e2e.common import tiny_overrides

RECIPE = "recipes/quickstart.yaml"
B_GLOBAL = 16  # tiny_overrides: 4 prompts x 4 samples per step
G = 4


@contextmanager
def components(out_dir: Path | None = None, **overrides):
    """`credo.train.build.build` of the quickstart recipe with the tiny test overrides; closes its stages."""
    from credo.train.build import build

    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="credo-inv-"))
    c = build(load_recipe(RECIPE, tiny_overrides(out_dir / "run", **{"run.eval_every": 0, **overrides})))
    try:
        yield c
    finally:
        c.source.close()
        c.reward.close()


def fixed_samples(seed: int = 0, n: int = B_GLOBAL, vocab: int = 128) -> list[Sample]:
    """`n` hand-made samples: prompts of 3-5 tokens, responses of 1-4 tokens (the length cap is 4), some
    with an observation token (response_mask 0), some unfinished (hit the cap)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p_len, r_len = 3 + i % 3, 1 + (i * 7) % 4
        prompt = torch.randint(3, vocab, (p_len,), generator=g).tolist()
        resp = torch.randint(3, vocab, (r_len,), generator=g).tolist()
        mask = [1] * r_len
        if i % 5 == 2 and r_len > 1:
            mask[0] = 0  # an environment token inside the response: never trained on
        rlp = [-float(x) * m for x, m in zip(torch.rand(r_len, generator=g) * 3 + 0.5, mask)]
        out.append(Sample(prompt, resp, mask, rlp, finished=r_len < 4 or i % 2 == 0))
    return out


def global_rows(rows: slice | None = None, drop: tuple[int, ...] = ()) -> list[int]:
    """The global sample indices a `fixed_batch(rows=..., drop=...)` holds, in order."""
    keep = [i for i in range(B_GLOBAL) if i not in drop]
    return keep[rows] if rows is not None else keep


def fixed_batch(c, *, seed: int = 0, rows: slice | None = None, invalid: tuple[int, ...] = (),
                drop: tuple[int, ...] = (), overlong_filter: bool | None = None) -> Batch:
    """The same global batch of `B_GLOBAL` samples on any world size: this rank's `rows` of it (all of it
    by default), rewarded by hand (samples in `invalid` have a failed reward call), packed with the
    components' overlong filter (or `overlong_filter`), advantages from the components' advantage stage.
    `drop` removes global samples before anything else (to compare a batch with and without a sample)."""
    samples = fixed_samples(seed)
    g = torch.Generator().manual_seed(seed + 1)
    rewards = torch.rand(B_GLOBAL, generator=g)
    valid = torch.ones(B_GLOBAL, dtype=torch.bool)
    valid[list(invalid)] = False
    rewards[~valid] = 0.0
    group_ids = torch.arange(B_GLOBAL // G).repeat_interleave(G)
    idx = global_rows(rows, drop)
    batch = Batch(samples=[samples[i] for i in idx], problems=[None] * len(idx), group_ids=group_ids[idx], step=1)
    batch.rewards, batch.valid = rewards[idx], valid[idx]
    pack_batch(batch, c.tokenizer.pad_token_id,
               overlong_filter=c.overlong_filter if overlong_filter is None else overlong_filter)
    c.advantage(batch)
    return batch


def off_policy_fields(c, batch: Batch, *, seed: int = 0, rows: list[int] | None = None) -> None:
    """Fill old/ref log-probs and per-token weights with fixed, non-trivial values (in place).

    old/ref are the policy's own log-probs (at the components' temperature) plus seeded noise, so PPO
    ratios spread over ~[0.35, 2.5] (both clip bounds and the dual clip are hit) and the KL term has a
    non-zero gradient. Noise is drawn for the global batch and indexed by `rows`, so every rank of a
    data-parallel run sees its share of the same values (`rows`: the global indices, see `global_rows`).
    """
    g = torch.Generator().manual_seed(seed + 2)
    T = batch.loss_mask.shape[1]
    rows = list(range(len(batch))) if rows is None else rows
    noise_old, noise_ref, w = (torch.randn(B_GLOBAL, 8, generator=g)[rows, :T] for _ in range(3))
    with torch.no_grad():
        base, _ = c.scorer(c.engine.module, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=False)
    batch.old_log_probs = (base + 0.5 * noise_old) * batch.loss_mask
    batch.ref_log_probs = (base + 0.3 * noise_ref) * batch.loss_mask
    batch.weights = (0.5 + w.abs()) * batch.loss_mask


# ------------------------------------------------------------------------------ the naive reference
def naive_loss(model, batch: Batch, rows, *, temperature: float, clip_low: float, clip_high: float,
               dual_clip: float | None, entropy_coef: float, kl_coef: float, agg_mode: str, norm_len: int,
               on_policy: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The objective of one mini-batch (`rows`), token by token, from explicit formulas:

        pg_t  = max(-r_t A_t, -clip(r_t, 1 - clip_low, 1 + clip_high) A_t) * w_t      r_t = pi/pi_old
                (dual clip: for A_t < 0, pg_t = min(pg_t, -dual_clip A_t) before the weight)
        H_t   = -sum_v p_v log p_v  of softmax(logits_t / temperature)
        KL_t  = pi_ref/pi - 1 - log(pi_ref/pi)                                         (k3)
        loss  = agg(pg) - entropy_coef * agg(H) + kl_coef * agg(KL)

    with the aggregation over the mini-batch's loss tokens written out per `agg_mode`.
    """
    rows = list(rows)
    ids, attn, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows]
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    per_seq = {"pg": [], "ent": [], "kl": []}
    for b, i in enumerate(rows):
        pg_s, ent_s, kl_s = [], [], []
        for t in range(mask.shape[1]):
            if not bool(mask[b, t]):
                continue
            z = logits[b, t] / temperature
            logp = z - torch.logsumexp(z, dim=0)
            lp = logp[int(ids[b, t + 1])]
            old = lp.detach() if on_policy else batch.old_log_probs[i, t]
            a = float(batch.advantages[i, t])
            r = torch.exp(lp - old)
            r_clipped = torch.minimum(torch.maximum(r, torch.tensor(1 - clip_low)), torch.tensor(1 + clip_high))
            pg = torch.maximum(-r * a, -r_clipped * a)
            if dual_clip is not None and a < 0:
                pg = torch.minimum(pg, torch.tensor(-dual_clip * a))
            w = 1.0 if batch.weights is None else float(batch.weights[i, t])
            pg_s.append(pg * w)
            ent_s.append(-(logp.exp() * logp).sum())
            if batch.ref_log_probs is not None:
                d = batch.ref_log_probs[i, t] - lp
                kl_s.append(torch.exp(d) - 1 - d)
        per_seq["pg"].append(pg_s)
        per_seq["ent"].append(ent_s)
        per_seq["kl"].append(kl_s)
    n_tok = sum(len(s) for s in per_seq["pg"])
    n_seq = sum(1 for s in per_seq["pg"] if s)

    def agg(seqs):
        zero = torch.zeros(())
        if agg_mode == "token-mean":
            return sum((sum(s, zero) for s in seqs), zero) / max(n_tok, 1)
        if agg_mode == "seq-mean-token-mean":
            return sum((sum(s, zero) / len(s) for s in seqs if s), zero) / max(n_seq, 1)
        if agg_mode == "seq-mean-token-sum":
            return sum((sum(s, zero) for s in seqs), zero) / max(n_seq, 1)
        assert agg_mode == "seq-mean-token-sum-norm", agg_mode
        return sum((sum(s, zero) / norm_len for s in seqs), zero) / max(n_seq, 1)

    terms = {"pg": agg(per_seq["pg"]), "ent": agg(per_seq["ent"])}
    loss = terms["pg"] - entropy_coef * terms["ent"]
    if batch.ref_log_probs is not None:
        terms["kl"] = agg(per_seq["kl"])
        loss = loss + kl_coef * terms["kl"]
    return loss, terms


def reference_update(model, batch: Batch, *, lr: float, betas, weight_decay: float, grad_clip: float,
                     warmup_steps: int, ppo_epochs: int, mini_batches: int, eps: float = 1e-8, **loss_args):
    """The whole update on a copy of `model`: epochs x mini-batches of naive loss, autograd, global-norm
    clipping, hand-written AdamW with linear warm-up. Returns (params after, last grad norm, losses)."""
    model = copy.deepcopy(model).float()
    params = dict(model.named_parameters())
    m = {k: torch.zeros_like(p) for k, p in params.items()}
    v = {k: torch.zeros_like(p) for k, p in params.items()}
    b1, b2 = betas
    step, norm, losses = 0, float("nan"), []
    on_policy = batch.old_log_probs is None  # then pi_old = pi_theta detached, as in a single pass
    for _ in range(ppo_epochs):
        for rows in torch.arange(len(batch)).tensor_split(mini_batches):
            model.zero_grad(set_to_none=True)
            loss, terms = naive_loss(model, batch, rows.tolist(), on_policy=on_policy, **loss_args)
            loss.backward()
            losses.append(loss.item())
            grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in params.items()}
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
            scale = grad_clip / (norm + 1e-6) if grad_clip > 0 and norm + 1e-6 > grad_clip else 1.0
            step += 1
            lr_t = lr * (min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0)
            with torch.no_grad():
                for k, p in params.items():
                    g = grads[k] * scale
                    m[k] = b1 * m[k] + (1 - b1) * g
                    v[k] = b2 * v[k] + (1 - b2) * g * g
                    m_hat, v_hat = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
                    p.mul_(1 - lr_t * weight_decay)
                    p.sub_(lr_t * m_hat / (v_hat.sqrt() + eps))
    return {k: p.detach().clone() for k, p in params.items()}, norm, losses


def objective_grads(c, batch):
    """The Updater's loss path on the whole batch as one micro-batch: scorer forward + Objective, backward."""
    model = c.engine.module
    model.zero_grad(set_to_none=True)
    m = batch.loss_mask
    lp, ent = c.scorer(model, batch.input_ids, batch.attention_mask, m, with_entropy=True)
    loss, terms, _ = c.objective(lp, ent, old_log_probs=batch.old_log_probs, advantages=batch.advantages, mask=m,
                                 rollout_log_probs=batch.rollout_log_probs, ref_log_probs=batch.ref_log_probs,
                                 weights=batch.weights, global_tokens=m.sum(), global_seqs=(m.sum(-1) > 0).sum())
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), terms, grads


def naive_grads(model, batch, **args):
    """Autograd of `naive_loss` over the whole batch, on a copy of `model`."""
    ref = copy.deepcopy(model).float()
    loss, terms = naive_loss(ref, batch, range(len(batch)), on_policy=batch.old_log_probs is None, **args)
    loss.backward()
    return loss.detach(), terms, {k: p.grad.detach().clone() for k, p in ref.named_parameters() if p.grad is not None}


def params_of(model) -> dict[str, torch.Tensor]:
    """Every parameter, whole (an FSDP2 shard is gathered: collective), in float32."""
    return {k: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().clone()
            for k, p in model.named_parameters()}


def max_param_gap(a: dict, b: dict) -> tuple[float, str]:
    gaps = {k: float((a[k] - b[k]).abs().max()) for k in a}
    worst = max(gaps, key=gaps.get)
    return gaps[worst], worst


def update_error(after: dict, want: dict, before: dict) -> tuple[float, float, str]:
    """How far the update `after - before` is from `want - before`: (relative L2 error, worst entry's
    gap as a fraction of the largest reference step, its parameter name)."""
    num = sum(float(((after[k] - want[k]).double() ** 2).sum()) for k in after) ** 0.5
    den = sum(float(((want[k] - before[k]).double() ** 2).sum()) for k in after) ** 0.5
    assert den > 0, "the reference update moved nothing"
    step, _ = max_param_gap(want, before)
    gap, where = max_param_gap(after, want)
    return num / den, gap / step, where


def assert_same_update(after: dict, want: dict, before: dict, *, rel: float = 1e-3) -> None:
    """The update `after - before` equals `want - before`: relative L2 error below `rel`, and no entry off
    by more than 2% of the largest step.

    AdamW's first steps are ~lr * g / (|g| + eps): entries whose gradient is within a few eps of 0 move by
    an amount that float32 noise in g changes by a few percent, so an entrywise tolerance tight enough
    for everything else would fail there on rounding alone.
    """
    err, worst, where = update_error(after, want, before)
    assert err < rel and worst < 0.02, \
        f"update differs from the reference: relative L2 error {err:.3g}, worst entry {worst:.3g} of the " \
        f"largest step at {where}"
