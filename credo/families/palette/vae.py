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

    def __init__(self, d_model: int, latent_dim: int, prefix_len: int, hidden: int, embed_std: float = 1.0,
                 encoder_input: str = "pair"):
        super().__init__()
        self.d_model, self.latent_dim, self.prefix_len = d_model, latent_dim, prefix_len
        self.encoder_input = encoder_input  # which tokens the encoder's input is pooled over (`encoder_input`)
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
def pooled_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  pool_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The encoder's input: the mean of the LM's last hidden state over the real tokens [B, d] (no gradient), or
    over the tokens of `pool_mask` [B, L] where given (the LM still reads the whole row)."""
    base = getattr(model, model.base_model_prefix)
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask if pool_mask is None else pool_mask * attention_mask
    return mean_pool(hidden if hidden.dtype == torch.float64 else hidden.float(), mask)  # bf16: mean in fp32


def encoder_input(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, answer_mask: torch.Tensor,
                  which: str = "pair") -> torch.Tensor:
    """The pooled state the encoder reads [B, d]: the mean over the (question, answer) tokens ('pair', the paper's
    input) or over the answer tokens only, EOS included ('answer', inferred option `palette.encoder_input`: the
    hidden states of a causal LM there still see the question, but the question's own tokens, whose operands
    dominate the pair's mean, are left out)."""
    if which == "pair":
        return pooled_states(model, input_ids, attention_mask)
    if which == "answer":
        return pooled_states(model, input_ids, attention_mask, answer_mask)
    raise ValueError(f"encoder input '{which}': expected 'pair' or 'answer'")


def elbo_terms(model, vae: PaletteVAE, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               answer_mask: torch.Tensor, eps: torch.Tensor, *, chunk_size: int = 1024,
               pool: str = "pair") -> dict[str, torch.Tensor]:
    """The two ELBO terms of each (question, answer) pair, with gradients to the VAE (and to the LM if it trains).

    Args:
        input_ids: [B, L] question + answer (+ EOS), right-padded. attention_mask: [B, L].
        answer_mask: [B, L] 1 on the answer tokens (the reconstruction's targets).
        eps: [B, n] standard-normal noise of the reparameterised draw.
        pool: the encoder's input, 'pair' or 'answer' (`encoder_input`).
    Returns:
        recon [B] (sum of the answer tokens' log-probs), kl [B], mu [B, n], logvar [B, n].
    """
    mu, logvar = vae.encode(encoder_input(model, input_ids, attention_mask, answer_mask, pool))
    z = mu + (0.5 * logvar).exp() * eps
    prefix = vae.decode(z)
    targets = answer_mask[:, 1:].bool()  # label-aligned: column j scores token j + 1
    lp, _ = policy_forward(model, input_ids, attention_mask, targets, temperature=1.0, chunk_size=chunk_size,
                           with_entropy=False, prefix_embeds=prefix)
    return {"recon": lp.sum(-1), "kl": kl_to_standard_normal(mu, logvar), "mu": mu, "logvar": logvar}


def kl_per_dim(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL( N(mu_j, exp(logvar_j)) || N(0, 1) ) of each latent dimension: [B, n]."""
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar)


def free_bits_kl(mu: torch.Tensor, logvar: torch.Tensor, free_bits: float) -> torch.Tensor:
    """The KL term with free bits (Kingma et al. 2016, inferred option `palette.free_bits`): each dimension's KL,
    averaged over the batch, counts as at least `free_bits` nats, sum_j max(free_bits, mean_b KL_bj), so a
    dimension under its floor gets no gradient pushing it to the prior. A scalar (already a batch mean)."""
    return torch.clamp(kl_per_dim(mu, logvar).mean(0), min=free_bits).sum()


def elbo_loss(terms: dict[str, torch.Tensor], kl_weight: float, free_bits: float = 0.0) -> torch.Tensor:
    """-(recon - kl_weight * kl), averaged over the pairs: the negative (beta-)ELBO per pair. With `free_bits` > 0
    the KL term is `free_bits_kl` (the recon term unchanged)."""
    if free_bits > 0:
        return kl_weight * free_bits_kl(terms["mu"], terms["logvar"], free_bits) - terms["recon"].mean()
    return (kl_weight * terms["kl"] - terms["recon"]).mean()


def vae_config(vae: PaletteVAE) -> dict:
    """What rebuilds the module around a saved state dict."""
    out = {"d_model": vae.d_model, "latent_dim": vae.latent_dim, "prefix_len": vae.prefix_len,
           "hidden": vae.encoder[0].out_features}
    if vae.encoder_input != "pair":  # the default leaves the saved file as it was
        out["encoder_input"] = vae.encoder_input
    return out


def load_vae(path) -> PaletteVAE:
    """A VAE saved by `save_vae` (its config and state dict in one torch file)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    vae = PaletteVAE(**saved["config"])
    vae.load_state_dict(saved["state"])
    return vae.eval().requires_grad_(False)


def save_vae(vae: PaletteVAE, path) -> None:
    torch.save({"config": vae_config(vae), "state": vae.state_dict()}, path)
