"""Reasoning Palette's VAE (arXiv 2512.17206): a latent reasoning context z, decoded into k soft-prompt embeddings.

    pooled  [B, d]      mean over the (question, answer) tokens of the LM's last hidden state (no gradient)
    encoder pooled -> (mu, logvar)  [B, n] each: q(z | x, y) = N(mu, diag(exp(logvar)))
    z       [B, n]      mu + exp(logvar / 2) * eps (reparameterised); N(0, I) draws at rollout time
    decoder z -> prefix [B, k, d]: k embeddings the LM reads before the prompt

    ELBO(x, y) = E_q[ log p_LM(y | prefix(z), x) ] - KL( q(z | x, y) || N(0, I) )

The reconstruction term is the LM's log-likelihood of the answer tokens (EOS included) given the prefix and the
question, one reparameterised draw per pair (inferred: the abstract names the VAE and its input, not its
reconstruction target; the likelihood of the answer is what makes z carry what the answer's form depends on).
The KL is the closed form for a diagonal Gaussian against N(0, I). `kl_weight` scales it (a beta-VAE; 1 is the ELBO).

The decoder's output is multiplied by `embed_std`, the standard deviation of the LM's input-embedding table, so a
prefix starts at the scale of the token embeddings it sits beside (inferred).
"""

from __future__ import annotations

import torch
from torch import nn

from credo.train.scoring import policy_forward


class PaletteVAE(nn.Module):
    """Encoder and decoder MLPs (one hidden layer each, GELU).

    Args:
        d_model: the LM's hidden (= embedding) width. latent_dim: n. prefix_len: k. hidden: the MLPs' width.
        embed_std: scale of the decoded prefix (the std of the LM's input embeddings).
    """

    def __init__(self, d_model: int, latent_dim: int, prefix_len: int, hidden: int, embed_std: float = 1.0):
        super().__init__()
        self.d_model, self.latent_dim, self.prefix_len = d_model, latent_dim, prefix_len
        self.encoder = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, 2 * latent_dim))
        self.decoder = nn.Sequential(nn.Linear(latent_dim, hidden), nn.GELU(), nn.Linear(hidden, prefix_len * d_model))
        self.register_buffer("embed_std", torch.tensor(float(embed_std)))

    def encode(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pooled [B, d] -> mu [B, n], logvar [B, n] (in the VAE's dtype, float32 unless cast)."""
        mu, logvar = self.encoder(pooled.to(self.embed_std.dtype)).chunk(2, dim=-1)
        return mu, logvar

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """z [B, n] -> prefix embeddings [B, k, d] (in the VAE's dtype)."""
        return (self.decoder(z.to(self.embed_std.dtype)) * self.embed_std).view(z.shape[0], self.prefix_len, self.d_model)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """hidden [B, L, d], mask [B, L] (1 on real tokens) -> [B, d]: the mean over each row's real tokens."""
    m = mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1)


def kl_to_standard_normal(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL( N(mu, diag(exp(logvar))) || N(0, I) ) per row: [B] = 0.5 * sum(mu^2 + exp(logvar) - 1 - logvar)."""
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(-1)


@torch.no_grad()
def pooled_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The encoder's input: the mean of the LM's last hidden state over the real tokens [B, d] (no gradient)."""
    base = getattr(model, model.base_model_prefix)
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return mean_pool(hidden if hidden.dtype == torch.float64 else hidden.float(), attention_mask)  # bf16: mean in fp32


def elbo_terms(model, vae: PaletteVAE, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               answer_mask: torch.Tensor, eps: torch.Tensor, *, chunk_size: int = 1024) -> dict[str, torch.Tensor]:
    """The two ELBO terms of each (question, answer) pair, with gradients to the VAE (and to the LM if it trains).

    Args:
        input_ids: [B, L] question + answer (+ EOS), right-padded. attention_mask: [B, L].
        answer_mask: [B, L] 1 on the answer tokens (the reconstruction's targets).
        eps: [B, n] standard-normal noise of the reparameterised draw.
    Returns:
        recon [B] (sum of the answer tokens' log-probs), kl [B], mu [B, n], logvar [B, n].
    """
    pooled = pooled_states(model, input_ids, attention_mask)
    mu, logvar = vae.encode(pooled)
    z = mu + (0.5 * logvar).exp() * eps
    prefix = vae.decode(z)
    targets = answer_mask[:, 1:].bool()  # label-aligned: column j scores token j + 1
    lp, _ = policy_forward(model, input_ids, attention_mask, targets, temperature=1.0, chunk_size=chunk_size,
                           with_entropy=False, prefix_embeds=prefix)
    return {"recon": lp.sum(-1), "kl": kl_to_standard_normal(mu, logvar), "mu": mu, "logvar": logvar}


def elbo_loss(terms: dict[str, torch.Tensor], kl_weight: float) -> torch.Tensor:
    """-(recon - kl_weight * kl), averaged over the pairs: the negative (beta-)ELBO per pair."""
    return (kl_weight * terms["kl"] - terms["recon"]).mean()


def vae_config(vae: PaletteVAE) -> dict:
    """What rebuilds the module around a saved state dict."""
    return {"d_model": vae.d_model, "latent_dim": vae.latent_dim, "prefix_len": vae.prefix_len,
            "hidden": vae.encoder[0].out_features}


def load_vae(path) -> PaletteVAE:
    """A VAE saved by `save_vae` (its config and state dict in one torch file)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    vae = PaletteVAE(**saved["config"])
    vae.load_state_dict(saved["state"])
    return vae.eval().requires_grad_(False)


def save_vae(vae: PaletteVAE, path) -> None:
    torch.save({"config": vae_config(vae), "state": vae.state_dict()}, path)
