"""Reasoning Palette's warm-up (arXiv 2512.17206): the VAE, then a brief SFT that teaches the LM to read prefixes.

Runs after credo's own SFT warm-up (when that is on), on the same demonstrations (the task's training answers):

    stage 1  palette.vae_steps   the VAE alone, on the negative ELBO, the LM frozen (inferred: the abstract infers z
                                 with a VAE and then adapts the model in "a brief SFT warm-up", so the VAE comes
                                 first; a frozen LM is steered by the prefix the way soft prompts steer one)
    stage 2  palette.sft_steps   the LM (and, with palette.sft_train_vae, the VAE: inferred) on the same loss: each
                                 demonstration is read after the prefix decoded from its own z ~ q(z | x, y), so the
                                 LM learns to follow the latent; the KL keeps q near the N(0, I) that RL samples from

The output, a model folder with the VAE beside it (`palette_vae.pt`), is cached like credo's warm-up, by a hash
of everything that shapes it: the starting policy's contents, the demonstrations and the palette settings of the
warm-up. A killed warm-up leaves no partial folder (written to a temporary name, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from credo.distributed.engine import device
from credo.families.palette.vae import PaletteVAE, elbo_loss, elbo_terms, save_vae
from credo.models import cache_root, check_vocab, load_causal_lm, load_tokenizer
from credo.sft import data_digest, encode_pair, model_digest
from credo.tasks.render import prompt_renderer

VAE_FILE = "palette_vae.pt"
WARMUP_KEYS = ("latent_dim", "prefix_len", "hidden_size", "kl_weight", "vae_steps", "sft_steps", "sft_train_vae",
               "batch_size", "vae_lr", "sft_lr", "seed")
"""The palette settings the warm-up depends on (the others act at RL time only)."""
OPTIONAL_WARMUP_KEYS = {"free_bits": 0.0, "encoder_input": "pair"}
"""Warm-up settings added later: in the key only when not at their default, so the older caches stay valid."""


def warmup_key(r, base_path: str) -> str:
    """Hash of the starting policy's files, the demonstrations and the warm-up's palette settings."""
    p = asdict(r.palette)
    payload = {"model": model_digest(Path(base_path)) if Path(base_path).is_dir() else {"hub_id": base_path},
               "data": data_digest(r), "palette": {k: p[k] for k in WARMUP_KEYS}, "version": 1}
    payload["palette"].update({k: p[k] for k, default in OPTIONAL_WARMUP_KEYS.items() if p[k] != default})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def demo_batch(tok, render, problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids [B, L] (question + answer + EOS, right-padded), attention_mask [B, L], answer_mask [B, L]."""
    pairs = [encode_pair(tok, render(p), p.answer) for p in problems]
    width = max(len(ids) for ids, _ in pairs)
    ids = torch.full((len(pairs), width), tok.pad_token_id)
    attn = torch.zeros(len(pairs), width, dtype=torch.long)
    answer = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (x, m) in enumerate(pairs):
        ids[i, :len(x)] = torch.tensor(x)
        attn[i, :len(x)] = 1
        answer[i, :len(m)] = torch.tensor(m)
    return ids, attn, answer


def new_vae(model, p) -> PaletteVAE:
    """A VAE for `model` with the section's shape, its prefix scaled like the model's token embeddings."""
    emb = model.get_input_embeddings().weight
    return PaletteVAE(emb.shape[1], p.latent_dim, p.prefix_len, p.hidden_size, embed_std=float(emb.detach().float().std()),
                      encoder_input=p.encoder_input)


def train_stage(model, vae, task, tok, render, p, *, steps: int, params: list, lr: float, gen: torch.Generator,
                log, name: str) -> dict:
    """`steps` AdamW steps of the negative ELBO over `params` (cosine decay); returns the last step's terms."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(steps, 1))))
    last: dict = {}
    t0, dev = time.time(), device()
    for step in range(steps):
        idx = torch.randint(0, len(task), (p.batch_size,), generator=gen).tolist()
        ids, attn, answer = (t.to(dev) for t in demo_batch(tok, render, [task.train(i) for i in idx]))
        eps = torch.randn(len(idx), p.latent_dim, generator=gen).to(dev)
        terms = elbo_terms(model, vae, ids, attn, answer, eps, pool=p.encoder_input)
        loss = elbo_loss(terms, p.kl_weight, p.free_bits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([q for g in opt.param_groups for q in g["params"]], 1.0)
        opt.step()
        sched.step()
        last = {"loss": loss.item(), "recon": terms["recon"].mean().item(), "kl": terms["kl"].mean().item()}
        if step % 50 == 0 or step == steps - 1:
            log(f"palette {name}: step {step + 1}/{steps} -ELBO {last['loss']:.3f} (log p(y|z,x) {last['recon']:.3f}, "
                f"KL {last['kl']:.3f}) ({time.time() - t0:.1f}s)")
    return last


def run_warmup(r, base_path: str, task, *, log=print) -> tuple[str, str]:
    """Warm up (or reuse the cache); return (policy folder with the VAE beside it, cache key)."""
    p = r.palette
    key = warmup_key(r, base_path)
    out = cache_root() / "palette" / key
    if (out / "COMPLETE").exists():
        log(f"palette: reusing cached warm-up {out}")
        return str(out), key
    tok = load_tokenizer(base_path)
    model = load_causal_lm(base_path, r.model.dtype).to(device())  # the trainer's device (a GPU when there is one)
    check_vocab(model, tok, base_path)
    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)
    with torch.random.fork_rng(devices=[]):  # the run's RNG must not depend on whether the cache was warm
        torch.manual_seed(p.seed)
        vae = new_vae(model, p).to(device())
    gen = torch.Generator().manual_seed(p.seed + 23)
    model.train()
    model.requires_grad_(False)
    stage1 = train_stage(model, vae, task, tok, render, p, steps=p.vae_steps, params=list(vae.parameters()),
                         lr=p.vae_lr, gen=gen, log=log, name="vae")
    model.requires_grad_(True)
    vae.requires_grad_(p.sft_train_vae)
    groups = [{"params": list(model.parameters()), "lr": p.sft_lr}]
    if p.sft_train_vae:
        groups.append({"params": list(vae.parameters()), "lr": p.vae_lr})
    stage2 = train_stage(model, vae, task, tok, render, p, steps=p.sft_steps, params=groups, lr=p.sft_lr, gen=gen,
                         log=log, name="sft")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    save_vae(vae.eval().cpu(), tmp / VAE_FILE)
    (tmp / "palette.json").write_text(json.dumps({"key": key, "base": str(base_path), "vae_stage": stage1,
                                                  "sft_stage": stage2}))
    (tmp / "COMPLETE").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same warm-up first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out), key
