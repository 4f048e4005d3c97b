"""The `palette` rollout source (Reasoning Palette, arXiv 2512.17206): each response reads its own latent's prefix.

    z_i      [n]     drawn from sample i's sampling seed: N(0, prior_scale^2 I) (z = 0, the prior's mean, for the
                     1 - inject_frac share that draws no latent); kept in `Sample.meta['latent_z']`
    prefix   [B, k, d]  the VAE's decoder on the z's (frozen during RL: inferred, the abstract trains the VAE and the
                     warm-up before RL and injects latents during it)
    engine   reads prefix_i before prompt i (`backend.generate(..., prefix_embeds=)`: hf inputs_embeds, vLLM prompt
             embeddings)
    trainer  `Batch.prefix_embeds` = the decoder on the z's stored in the samples: the recompute, the reference and
             every update forward read the same rows

Every seed is a function of (run seed, step, sample), so a z is too: a resumed run draws the same latents, and no
sample is pending across a checkpoint (this source is synchronous), so the VAE is all the state there is; it is
saved with every checkpoint all the same (its weights, not a path to the warm-up cache).

Evaluation samples through `generate`: each eval sample draws its z from its own seed, or all use palette.eval_z
(steering the evaluation to one strategy); greedy decoding (no seeds) uses eval_z or z = 0.

`DiversityHook` logs, after each step, the within-group diversity of the step's responses: palette/distinct_frac
(distinct responses per group / group size), palette/strategy_entropy (entropy in nats of the task's strategy labels
within a group, when the task names strategies) and palette/strategy_<name>_frac.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections import Counter

import torch

from credo.distributed.engine import all_reduce_sum, device
from credo.families.palette.vae import load_vae
from credo.families.palette.warmup import VAE_FILE
from credo.train.batch import Batch

Z_SALT = 0x5A
"""Mixed into a sample's sampling seed to seed its latent (so z and the tokens' sampling stream differ)."""


def latent_for_seed(seed: int, latent_dim: int, *, prior_scale: float, inject_frac: float) -> torch.Tensor:
    """z [n] of the sample whose sampling seed is `seed`: N(0, prior_scale^2 I), or 0 with probability 1 - inject_frac."""
    s = int.from_bytes(hashlib.sha256(f"{seed}:{Z_SALT}".encode()).digest()[:8], "little") & (2**63 - 1)
    gen = torch.Generator().manual_seed(s)
    inject = float(torch.rand((), generator=gen)) < inject_frac
    z = torch.randn(latent_dim, generator=gen) * prior_scale
    return z if inject else torch.zeros(latent_dim)


class LatentBackend:
    """Wraps a rollout backend: every `generate` call decodes a z per prompt into its prefix and records the z.

    `latents(seeds, n)` [n, latent_dim] gives the z's; the fixed `eval_z` replaces them when set for `generate`
    calls the evaluation makes (`fixed_z`)."""

    def __init__(self, backend, vae, *, prior_scale: float, inject_frac: float):
        self.backend, self.vae = backend, vae
        self.prior_scale, self.inject_frac = prior_scale, inject_frac
        self.fixed_z: torch.Tensor | None = None

    def latents(self, seeds: list[int] | None, n: int) -> torch.Tensor:
        if self.fixed_z is not None:
            return self.fixed_z.float().expand(n, -1).clone()
        if seeds is None:  # greedy decoding: the prior's mean
            return torch.zeros(n, self.vae.latent_dim)
        return torch.stack([latent_for_seed(s, self.vae.latent_dim, prior_scale=self.prior_scale,
                                            inject_frac=self.inject_frac) for s in seeds])

    @torch.no_grad()
    def prefixes(self, z: torch.Tensor) -> torch.Tensor:
        """[n, latent_dim] -> [n, k, d] on the trainer's device."""
        return self.vae.to(device()).decode(z.to(device()))

    @property
    def kept_set_order(self) -> str:
        """The wrapped engine's truncation order (`credo.algos.kept_set`): kept-set replay recomputes with it."""
        return getattr(self.backend, "kept_set_order", "hf")

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds, prefix_embeds=None, **truncation):
        """The wrapped backend's `generate` with each prompt's prefix; `truncation` (top_k, min_p, kept_set) is
        passed on as the default source sets it."""
        if prefix_embeds is not None:
            raise ValueError("LatentBackend makes the prefixes itself: prefix_embeds must be None")
        z = self.latents(seeds, len(prompts))
        samples = self.backend.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                        seeds=seeds, prefix_embeds=self.prefixes(z) if prompts else None, **truncation)
        for s, row in zip(samples, z.tolist()):
            s.meta["latent_z"] = row
        return samples

    def sync_weights(self, model, version: int) -> None:
        self.backend.sync_weights(model, version)

    def close(self) -> None:
        self.backend.close()


class PaletteRollout:
    """The default single-turn source, sampling through a `LatentBackend`; it adds `Batch.prefix_embeds`."""

    def __init__(self, inner, latent: LatentBackend, eval_z: list[float] | None = None):
        self.inner, self.latent = inner, latent
        self.eval_z = None if eval_z is None else torch.tensor(eval_z, dtype=torch.float32)

    def rollout(self, step: int) -> Batch:
        batch = self.inner.rollout(step)
        z = torch.tensor([s.meta["latent_z"] for s in batch.samples], dtype=torch.float32)
        batch.prefix_embeds = self.latent.prefixes(z)  # the stored z's, decoded again: the rows the engine read
        return batch

    def generate(self, prompts, *, temperature: float, seeds):
        """Evaluation's sampling: each sample's own z from its seed, or palette.eval_z for all."""
        self.latent.fixed_z = self.eval_z
        try:
            return self.inner.generate(prompts, temperature=temperature, seeds=seeds)
        finally:
            self.latent.fixed_z = None

    def sync(self, model, step: int) -> None:
        self.inner.sync(model, step)

    def state_dict(self) -> dict:
        """The VAE's weights (tensors: written by torch.save with the checkpoint); no latent is pending here."""
        return {"vae": {k: v.detach().cpu().clone() for k, v in self.latent.vae.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        if "vae" in state:
            self.latent.vae.load_state_dict(state["vae"])

    def close(self) -> None:
        self.inner.close()


def palette_source(ctx) -> PaletteRollout:
    """The `palette` rollout stage: the default source (ctx.default) sampling through the VAE in the policy folder."""
    from pathlib import Path

    from credo.errors import ConfigError

    path = Path(ctx.policy_path) / VAE_FILE
    if not path.is_file():
        raise ConfigError(f"stages.rollout = 'palette' needs the palette warm-up's VAE ({path} is missing): set "
                          "palette.enabled: true, which runs the warm-up")
    p = ctx.section
    vae = load_vae(path)
    if vae.latent_dim != p.latent_dim or vae.prefix_len != p.prefix_len:
        raise ConfigError(f"the VAE in {path} has latent_dim {vae.latent_dim} and prefix_len {vae.prefix_len}; the "
                          f"recipe's palette.latent_dim is {p.latent_dim} and palette.prefix_len {p.prefix_len}")
    latent = LatentBackend(ctx.default.backend, vae, prior_scale=p.prior_scale, inject_frac=p.inject_frac)
    inner = copy.copy(ctx.default)  # the same prompts, seeds and holdout; only the backend differs
    inner.backend = latent
    return PaletteRollout(inner, latent, eval_z=p.eval_z)


def group_diversity(texts: list[str], groups: list[int], strategy=None) -> dict[str, float]:
    """Sums over the groups of `texts` (each group: the responses of one prompt): distinct responses / group size,
    entropy (nats) of the strategy labels, and each label's count; plus the number of groups and responses."""
    by_group: dict[int, list[str]] = {}
    for t, g in zip(texts, groups):
        by_group.setdefault(g, []).append(t)
    out = {"groups": float(len(by_group)), "responses": float(len(texts)), "distinct_frac": 0.0}
    for members in by_group.values():
        out["distinct_frac"] += len(set(members)) / len(members)
        if strategy is not None:
            counts = Counter(strategy(t) for t in members)
            out["strategy_entropy"] = out.get("strategy_entropy", 0.0) - sum(
                c / len(members) * math.log(c / len(members)) for c in counts.values())
            for label, c in counts.items():
                out[f"strategy_{label}"] = out.get(f"strategy_{label}", 0.0) + c
    return out


class DiversityHook:
    """Step hook: the within-group diversity of the step's responses, over all ranks (module docstring)."""

    name = "palette"

    def __init__(self, tokenizer, strategy=None, labels: tuple[str, ...] = ()):
        self.tokenizer, self.strategy = tokenizer, strategy
        self.labels = tuple(labels) if strategy is not None else ()  # each logged as palette/strategy_<label>_frac

    def before_step(self, step: int) -> None:
        pass

    def after_sync(self, step: int, batch: Batch) -> dict[str, float]:
        texts = self.tokenizer.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=True)
        d = group_diversity(texts, batch.group_ids.tolist(), self.strategy)
        keys = ["groups", "responses", "distinct_frac"] + (
            ["strategy_entropy"] + [f"strategy_{x}" for x in self.labels] if self.strategy is not None else [])
        tot = dict(zip(keys, all_reduce_sum(torch.tensor([d.get(k, 0.0) for k in keys], dtype=torch.float64)).tolist()))
        out = {"palette/distinct_frac": tot["distinct_frac"] / max(tot["groups"], 1)}
        if self.strategy is not None:
            out["palette/strategy_entropy"] = tot["strategy_entropy"] / max(tot["groups"], 1)
            out.update({f"palette/strategy_{x}_frac": tot[f"strategy_{x}"] / max(tot["responses"], 1)
                        for x in self.labels})
        return out
