"""The objective: policy loss + KL + entropy bonus with per-token weights, bound once from the recipe.

    loss = pg_loss(log_probs, old, advantages, mask, weights=...) - entropy_coef * H + kl_coef * KL
           + sum of coef * aggregate((log_probs - target)^2 / 2) over the batch's target terms (distillation)

Every term is aggregated with the same `agg_mode` and the mini-batch's global token/sequence counts
(summed over micro-batches and ranks), so summing micro-batch gradients gives the full-batch gradient
whatever the split.
"""

from __future__ import annotations

from typing import Callable

import torch

from credo import algos


class Objective:
    """Binds a policy loss of `credo.algos.POLICY_LOSSES` and the KL/entropy terms.

    Args:
        policy_loss: the loss function; `loss_kwargs` its recipe keyword arguments.
        kl_estimator: a KL estimator `fn(log_probs, ref_log_probs) -> [B, T]`, or None without a KL term.
        norm_len: the constant length of `seq-mean-token-sum-norm` (the rollout's max_new_tokens).
    """

    def __init__(self, policy_loss: Callable, loss_kwargs: dict, *, agg_mode: str, entropy_coef: float,
                 kl_coef: float, kl_estimator: Callable | None, norm_len: int):
        self.policy_loss, self.loss_kwargs = policy_loss, dict(loss_kwargs)
        self.agg_mode, self.entropy_coef, self.kl_coef = agg_mode, entropy_coef, kl_coef
        self.kl_estimator, self.norm_len = kl_estimator, norm_len
        self.target_coefs: dict[str, float] = {}  # the coefficient of each target term seen (for `total`)

    def __call__(self, log_probs: torch.Tensor, entropy: torch.Tensor, *, old_log_probs: torch.Tensor,
                 advantages: torch.Tensor, mask: torch.Tensor, rollout_log_probs: torch.Tensor,
                 ref_log_probs: torch.Tensor | None, weights: torch.Tensor | None, global_tokens: torch.Tensor,
                 global_seqs: torch.Tensor, entropy_mask: torch.Tensor | None = None,
                 target_terms: dict[str, tuple[float, torch.Tensor]] | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
        """One micro-batch's loss.

        Args:
            log_probs, entropy, old_log_probs, advantages, rollout_log_probs, ref_log_probs, weights: [b, T].
            mask: [b, T] bool, the loss tokens. global_tokens, global_seqs: scalars, the mini-batch's counts.
            entropy_mask: [b, T] bool or None: the tokens whose entropy enters the bonus (AsyPPO's filter
                I^H multiplies the token term; the normaliser stays the loss tokens' count). None = all.
            target_terms: name -> (coefficient, target log-probs [b, T]) (`Batch.target_terms`): each adds
                coefficient * aggregate((log_probs - target)^2 / 2) and is logged as `train/<name>`.
        Returns:
            (loss, terms, loss_metrics): the scalar to backpropagate; `train/pg_loss`, `train/entropy` and
            `train/kl` (None without KL) as tensors; the policy loss's own metrics.
        """
        agg = dict(global_tokens=global_tokens, global_seqs=global_seqs, norm_len=self.norm_len)
        extra = {} if weights is None else {"weights": weights}
        pg, metrics = self.policy_loss(log_probs, old_log_probs, advantages, mask, agg_mode=self.agg_mode,
                                       rollout_log_probs=rollout_log_probs, **agg, **extra, **self.loss_kwargs)
        # the entropy is detached when its coefficient is 0: logged, never backpropagated
        ent, unfiltered = entropy.detach() if self.entropy_coef == 0 else entropy, {}
        if entropy_mask is not None:  # logged as train/entropy_unfiltered; train/entropy is the bonus term
            unfiltered = {"train/entropy_unfiltered": algos.aggregate(ent.detach(), mask, self.agg_mode, **agg)}
            ent = ent * entropy_mask
        ent_term = algos.aggregate(ent, mask, self.agg_mode, **agg)
        loss = pg - self.entropy_coef * ent_term
        kl_term = None
        if ref_log_probs is not None and self.kl_estimator is not None:
            kl_term = algos.aggregate(self.kl_estimator(log_probs, ref_log_probs), mask, self.agg_mode, **agg)
            loss = loss + self.kl_coef * kl_term
        targets = {}
        for name, (coef, target) in (target_terms or {}).items():  # on-policy distillation's loss-term form
            targets[f"train/{name}"] = algos.distill_kl_loss(log_probs, target, mask, agg_mode=self.agg_mode, **agg)
            loss = loss + coef * targets[f"train/{name}"]
            self.target_coefs[f"train/{name}"] = coef
        return loss, {"train/pg_loss": pg, "train/entropy": ent_term, "train/kl": kl_term, **unfiltered,
                      **targets}, metrics

    def total(self, terms: dict[str, float]) -> float:
        """The logged `train/loss` from the step's mean terms, with the same signs as the backward pass."""
        return terms.get("train/pg_loss", 0.0) - self.entropy_coef * terms.get("train/entropy", 0.0) + \
            self.kl_coef * terms.get("train/kl", 0.0) + \
            sum(coef * terms[k] for k, coef in self.target_coefs.items() if k in terms)
