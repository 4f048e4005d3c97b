"""The `turn_credit` advantage stage: credit for multi-turn trajectories, selected by `credit`.

    mc_rebn  GEM (arXiv 2510.01051): per-turn Monte-Carlo returns with discount gamma, batch-normalised (ReBN)
             over every turn of every kept episode on all ranks; each token of a turn gets its turn's value
    mc       the same returns without normalisation (plain REINFORCE)
    grpo     trajectory level: the episode return (sum of turn rewards) normalised within its group of G
             episodes of the same env seed (`credo.algos` grpo), on every token of the trajectory
    ipa      IPA (arXiv 2512.24873, Eq. 7): chunk returns with the chunks = the model's turns
             (`credo.credit.chunk_returns_from_rewards`), unnormalised as ROLL's agentic_reinforce; pair it
             with algo.policy_loss: ipa (chunk-level geometric IS ratio, chunk mismatch mask, TOPR)

Turns are found from the packed response mask (`credo.credit.chunk_ids`: maximal runs of mask 1), and checked
against the rollout's own per-turn record (`meta['turn_rewards']`), so a layout error fails loudly.
Token-level PPO with a critic is not this stage: it is the critic stage (critic.num_critics: 1,
algo.advantage: gae) fed the episode return by the `env` reward stage.
"""

from __future__ import annotations

import torch

from credo import algos
from credo.config import ConfigError
from credo.credit.chunks import chunk_ids, chunk_returns_from_rewards, chunk_to_tokens, num_chunks
from credo.credit.turns import return_batch_norm, turn_returns
from credo.distributed.engine import all_gather_cat, all_reduce_max, rank_and_world
from credo.train.advantage import OutcomeAdvantage, gather_rows
from credo.train.batch import Batch
from credo.train.registry import register_stage

CREDITS = ("mc_rebn", "mc", "grpo", "ipa")


def turn_reward_matrix(batch: Batch, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K] per-turn rewards from the samples' meta and [B] turn counts, checked against the chunks of `ids`."""
    counts = num_chunks(ids)
    K = max([len(s.meta["turn_rewards"]) for s in batch.samples] + [1])
    rewards = torch.zeros(len(batch), K)
    for b, s in enumerate(batch.samples):
        r = s.meta["turn_rewards"]
        rewards[b, :len(r)] = torch.tensor(r, dtype=torch.float32)
        if batch.valid[b] and len(r) != int(counts[b]):
            raise ValueError(f"sample {b}: the rollout recorded {len(r)} turns but the response mask has "
                             f"{int(counts[b])} chunks; expected one chunk per model turn")
    return rewards, counts


class TurnCredit:
    def __init__(self, credit: str, gamma: float, eps: float):
        self.credit, self.gamma, self.eps = credit, gamma, eps
        self.grpo = OutcomeAdvantage(algos.ADVANTAGE_ESTIMATORS["grpo"], {})

    def __call__(self, batch: Batch) -> None:
        if self.credit == "grpo":
            self.grpo(batch)
            return
        ids = chunk_ids(batch.response_mask)
        rewards, counts = turn_reward_matrix(batch, ids)
        if self.credit == "ipa":
            adv = chunk_returns_from_rewards(rewards, ids, self.gamma)
        else:
            returns = turn_returns(rewards, counts, self.gamma)
            if self.credit == "mc_rebn":
                returns = self._rebn(returns, counts, batch.valid)
            adv = chunk_to_tokens(returns, ids, 0.0)
        batch.advantages = adv * batch.loss_mask
        exists = torch.arange(rewards.shape[1])[None, :] < counts[:, None]
        batch.metrics["credit/turns_mean"] = float(counts[batch.valid].float().mean()) if batch.valid.any() else 0.0
        batch.metrics["credit/turn_reward_mean"] = float(rewards[exists].mean()) if exists.any() else 0.0

    def _rebn(self, returns: torch.Tensor, counts: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """ReBN over every rank's transitions; this rank's rows back."""
        rank, _ = rank_and_world()
        B, K = returns.shape
        width = int(all_reduce_max(torch.tensor(K)))
        keep = (torch.arange(K)[None, :] < counts[:, None]) & valid[:, None]
        all_ret, all_keep = gather_rows(returns, width), gather_rows(keep, width)
        return return_batch_norm(all_ret, all_keep, self.eps)[rank * B:(rank + 1) * B, :K]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@register_stage("advantage", "turn_credit")
def turn_credit(ctx, *, credit: str = "mc_rebn", gamma: float = 1.0, eps: float = 1e-9) -> TurnCredit:
    """stages.advantage_kwargs: credit (mc_rebn, mc, grpo or ipa), gamma (per-turn discount), eps (ReBN)."""
    if credit not in CREDITS:
        raise ConfigError(f"config key 'stages.advantage_kwargs.credit' = {credit!r}: expected one of {', '.join(CREDITS)}")
    if not 0 <= gamma <= 1:
        raise ConfigError(f"config key 'stages.advantage_kwargs.gamma' = {gamma!r} is out of range: expected in [0, 1]")
    if credit == "grpo" and ctx.rollout.get("group_size", 2) < 2:
        raise ConfigError("config key 'rollout.group_size' must be >= 2 with credit: grpo (the group baseline)")
    return TurnCredit(credit, gamma, eps)
