"""Inference with a chosen latent (Reasoning Palette, arXiv 2512.17206): pick z to steer the strategy.

    credo palette RUN_DIR --prompt 47+86= --z 1.2,-0.4,...          a z given (latent_dim numbers)
    credo palette RUN_DIR --prompt 47+86= --like "7+6+0=13,4+8+1=13>133" --like-prompt 12+34=
                                                                    z = the posterior mean mu(x, y) of an example
    credo palette RUN_DIR --prompt 47+86= --samples 8               z ~ N(0, I) per sample (the RL-time prior)

RUN_DIR is a run folder (its `final/` policy, the VAE from its newest checkpoint, the settings from its
config.yaml) or a model folder holding `palette_vae.pt` beside the weights (the palette warm-up's output).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from credo.errors import ConfigError
from credo.families.palette.vae import PaletteVAE, encoder_input, load_vae
from credo.families.palette.warmup import VAE_FILE


def load_steerable(folder: str):
    """(model, tokenizer, vae) of a run folder or of a palette model folder (module docstring)."""
    from credo.checkpoint import list_checkpoints
    from credo.models import load_causal_lm, load_tokenizer

    root = Path(folder)
    if (root / VAE_FILE).is_file():
        return load_causal_lm(str(root)).eval(), load_tokenizer(str(root)), load_vae(root / VAE_FILE)
    if not (root / "final").is_dir() or not (root / "config.yaml").is_file():
        raise ConfigError(f"'{folder}' is neither a run folder (final/ and config.yaml) nor a model folder with "
                          f"{VAE_FILE}")
    cfg = yaml.safe_load((root / "config.yaml").read_text()).get("palette") or {}
    if not cfg.get("enabled"):
        raise ConfigError(f"the run in '{folder}' did not train with palette.enabled: it has no VAE")
    ckpts = list_checkpoints(root / "checkpoints")
    if not ckpts:
        raise ConfigError(f"'{folder}' has no checkpoint holding the VAE (checkpoints/step_*)")
    model = load_causal_lm(str(root / "final")).eval()
    state = torch.load(ckpts[-1] / "source" / "rank0.pt", map_location="cpu", weights_only=True)["vae"]
    vae = PaletteVAE(model.config.hidden_size, cfg["latent_dim"], cfg["prefix_len"], cfg["hidden_size"],
                     encoder_input=cfg.get("encoder_input", "pair"))
    vae.load_state_dict(state)
    return model, load_tokenizer(str(root / "final")), vae.eval().requires_grad_(False)


@torch.no_grad()
def posterior_mean(model, tokenizer, vae, prompt: str, answer: str) -> torch.Tensor:
    """mu(x, y) [n]: the latent the encoder gives an example (question, answer) pair."""
    from credo.families.palette.warmup import demo_batch
    from credo.tasks import Problem
    from credo.tasks.render import plain_prompt

    ids, attn, answer_mask = demo_batch(tokenizer, plain_prompt, [Problem(prompt, answer)])
    mu, _ = vae.encode(encoder_input(model, ids, attn, answer_mask, vae.encoder_input))
    return mu[0]


@torch.no_grad()
def generate_with_z(model, tokenizer, vae, prompts: list[str], z: torch.Tensor, *, max_new_tokens: int,
                    temperature: float, seed: int = 0) -> list[str]:
    """One completion per (prompt, z row): prompts [N] text, z [N, n]; temperature 0 decodes greedily."""
    from credo.distributed.rollout import HFBackend

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    seeds = None if temperature == 0 else [seed * 100_003 + i for i in range(len(prompts))]
    samples = HFBackend(model, tokenizer).generate(ids, max_new_tokens=max_new_tokens, temperature=temperature or 1.0,
                                                   top_p=1.0, seeds=seeds, prefix_embeds=vae.decode(z))
    return tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)


def parse_z(text: str, latent_dim: int) -> torch.Tensor:
    try:
        z = [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--z '{text}': expected {latent_dim} comma-separated numbers") from None
    if len(z) != latent_dim:
        raise ConfigError(f"--z has {len(z)} numbers, expected latent_dim = {latent_dim}")
    return torch.tensor(z)


def main(args) -> int:
    """`credo palette`: completions of --prompt under the chosen z, one JSON line each."""
    model, tok, vae = load_steerable(args.run)
    n = args.samples
    if args.z is not None:
        z = parse_z(args.z, vae.latent_dim).expand(n, -1)
    elif args.like is not None:
        z = posterior_mean(model, tok, vae, args.like_prompt or args.prompt, args.like).expand(n, -1)
    else:
        z = torch.randn(n, vae.latent_dim, generator=torch.Generator().manual_seed(args.seed))
    texts = generate_with_z(model, tok, vae, [args.prompt] * n, z, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, seed=args.seed)
    for row, text in zip(z.tolist(), texts):
        print(json.dumps({"prompt": args.prompt, "z": [round(x, 4) for x in row], "completion": text}))
    return 0
