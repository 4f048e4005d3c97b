"""credo's policy losses inside TRL's `GRPOTrainer`: keep TRL's generation, rewards and data; swap the loss.

    from trl import GRPOConfig
    from credo.integrations.trl import CredoGRPOTrainer

    trainer = CredoGRPOTrainer(
        model="my-model", reward_funcs=[my_reward], args=GRPOConfig(output_dir="out"), train_dataset=ds,
        policy_loss="cispo", loss_kwargs={"clip_high": 4.0}, agg_mode="seq-mean-token-sum-norm",
    )
    trainer.train()

TRL computes the group-normalised advantages, the old and reference log-probs and the rewards as usual;
only `_compute_loss` changes: the per-token log-probs of the completion go to the named entry of
`credo.algos.POLICY_LOSSES` with the advantages broadcast over tokens, aggregated with `agg_mode` over the
micro-batch (token-mean over a micro-batch is TRL's `bnpo`), then divided by the gradient-accumulation
steps as TRL's own `grpo`/`bnpo` losses are. TRL's `beta` adds a k3 KL to the reference
(`credo.algos.KL_ESTIMATORS['k3']`, TRL's estimator) aggregated the same way. The sampler's log-probs
(`sampling_per_token_logps`, with vLLM) reach the loss as `rollout_log_probs`, so `loss_kwargs={'correction':
'tis'}` applies credo's train/inference correction. TRL options the credo loss replaces (`loss_type`,
`epsilon`, `epsilon_high`, `delta`, `top_entropy_quantile`, `off_policy_mask_threshold`, the entropy
bonus) are not applied by this trainer. The loss's metrics are logged as `credo/<name>`.

Tested with TRL 1.16 (`_compute_loss(model, inputs)` and `_get_per_token_logps_and_entropies`).
"""

from __future__ import annotations

import warnings

import torch

from credo import algos


def _import_grpo_trainer():
    """`trl.GRPOTrainer`, showing each distinct warning of its import once.

    TRL 1.16 warns about an untested vLLM version from each of the 5 modules that ask whether vLLM is there, and
    Python shows a warning once per place it comes from, so the same line came 5 times. A "once" filter does not
    hold: any filter change during the import (transformers makes some) clears Python's once-registry.
    """
    shown, previous = set(), warnings.showwarning

    def show_once(message, category, filename, lineno, file=None, line=None):
        if (str(message), category) not in shown:
            shown.add((str(message), category))
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show_once
    try:
        from trl import GRPOTrainer
    finally:
        if warnings.showwarning is show_once:
            warnings.showwarning = previous
    return GRPOTrainer


GRPOTrainer = _import_grpo_trainer()


def credo_grpo_loss(per_token_logps: torch.Tensor, inputs: dict, *, policy_loss: str = "ppo",
                    loss_kwargs: dict | None = None, agg_mode: str = "token-mean", beta: float = 0.0,
                    norm_len: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one TRL micro-batch with a credo policy loss (before gradient-accumulation scaling).

    Args:
        per_token_logps: [B, T] log pi_theta of the completion tokens (with grad).
        inputs: TRL's batch: `completion_mask` [B, T], `advantages` [B] or [B, T], and optionally
            `old_per_token_logps`, `ref_per_token_logps`, `sampling_per_token_logps` ([B, T] each) and
            `tool_mask` [B, T].
        policy_loss: a name in credo.algos.POLICY_LOSSES; loss_kwargs its keyword arguments.
        agg_mode: credo's aggregation over this micro-batch. beta: weight of the k3 KL (needs ref log-probs).
        norm_len: the constant length of `seq-mean-token-sum-norm` (TRL's max_completion_length).
    Returns:
        (loss, metrics): the scalar to minimise and the loss's metrics as floats.
    """
    if policy_loss not in algos.POLICY_LOSSES:
        raise ValueError(f"policy_loss = '{policy_loss}' is not in credo.algos.POLICY_LOSSES "
                         f"(known: {', '.join(sorted(algos.POLICY_LOSSES))})")
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    mask = mask.bool()
    adv = inputs["advantages"]
    adv = adv.unsqueeze(1).expand_as(per_token_logps) if adv.dim() == 1 else adv
    old = inputs.get("old_per_token_logps")
    old = per_token_logps.detach() if old is None else old
    extra = {}
    if inputs.get("sampling_per_token_logps") is not None:
        extra["rollout_log_probs"] = inputs["sampling_per_token_logps"]
    agg = dict(agg_mode=agg_mode, global_tokens=mask.sum(), global_seqs=(mask.sum(-1) > 0).sum(),
               norm_len=norm_len or per_token_logps.shape[1])
    loss, metrics = algos.POLICY_LOSSES[policy_loss](per_token_logps, old, adv.detach(), mask, **agg, **extra,
                                                     **(loss_kwargs or {}))
    out = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in metrics.items()}
    if beta != 0.0:
        kl = algos.aggregate(algos.KL_ESTIMATORS["k3"](per_token_logps, inputs["ref_per_token_logps"]), mask,
                             agg_mode, global_tokens=agg["global_tokens"], global_seqs=agg["global_seqs"],
                             norm_len=agg["norm_len"])
        loss = loss + beta * kl
        out["kl"] = float(kl.detach())
    return loss, out


class CredoGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with its policy loss replaced by a credo one (see the module docstring).

    Args (besides GRPOTrainer's):
        policy_loss: a name in credo.algos.POLICY_LOSSES (ppo, cispo, gspo, sapo, ...).
        loss_kwargs: its keyword arguments, e.g. {"clip_low": 0.2, "clip_high": 0.28}.
        agg_mode: token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm.
    """

    def __init__(self, *args, policy_loss: str = "ppo", loss_kwargs: dict | None = None,
                 agg_mode: str = "token-mean", **kwargs):
        if policy_loss not in algos.POLICY_LOSSES:
            raise ValueError(f"policy_loss = '{policy_loss}' is not in credo.algos.POLICY_LOSSES "
                             f"(known: {', '.join(sorted(algos.POLICY_LOSSES))})")
        super().__init__(*args, **kwargs)
        self.credo_policy_loss, self.credo_loss_kwargs, self.credo_agg_mode = policy_loss, dict(loss_kwargs or {}), agg_mode

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        loss, metrics = credo_grpo_loss(per_token_logps, inputs, policy_loss=self.credo_policy_loss,
                                        loss_kwargs=self.credo_loss_kwargs, agg_mode=self.credo_agg_mode,
                                        beta=self.beta, norm_len=self.max_completion_length)
        mode = "train" if self.model.training else "eval"
        if mode == "train":  # TRL turns off the Trainer's own accumulation scaling for this loss
            loss = loss / self.current_gradient_accumulation_steps
        mask = completion_mask.bool()
        entropy = (entropies.detach() * mask).sum() / mask.sum().clamp(min=1)  # a metric: no grad to carry
        self._metrics[mode]["entropy"].append(float(entropy))
        for k, v in metrics.items():
            self._metrics[mode][f"credo/{k}"].append(v)
        return loss
