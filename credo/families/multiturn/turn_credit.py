"""The `turn_credit` advantage stage: credit for multi-turn trajectories, selected by `credit`.

    mc_rebn  GEM (arXiv 2510.01051): per-turn Monte-Carlo returns with discount gamma, batch-normalised (ReBN)
             over every turn of every kept episode on all ranks (`credo.algos.rebn`, population std,
             eps 1e-9); each token of a turn gets its turn's value
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
import torch.nn.functional as F

from credo import algos
from credo.errors import ConfigError
from credo.train.registry import stage_settings
from credo.credit.chunks import chunk_ids, chunk_returns_from_rewards, num_chunks
from credo.distributed.engine import all_gather_cat, all_reduce_max, rank_and_world
from credo.train.advantage import OutcomeAdvantage, gather_rows
from credo.train.batch import Batch

from credo.families.multiturn.config import CREDITS, TurnCreditSettings  # noqa: E402


def turn_reward_matrix(batch: Batch, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K] per-turn rewards from the samples' meta and [B] turn counts, checked against the chunks of `ids`."""
    counts = num_chunks(ids)
    K = max([len(s.meta["turn_rewards"]) for s in batch.samples] + [1])
    rewards = torch.zeros(len(batch), K, device="cpu")
    for b, s in enumerate(batch.samples):
        r = s.meta["turn_rewards"]
        rewards[b, :len(r)] = torch.tensor(r, dtype=torch.float32, device="cpu")
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
            adv = self._rebn(rewards, counts, ids, batch.valid)
        batch.advantages = adv * batch.loss_mask
        # over kept episodes only, like credit/turns_mean and env/return_mean: a failed episode's turns train nothing
        exists = (torch.arange(rewards.shape[1], device=counts.device)[None, :] < counts[:, None]) & batch.valid[:, None]
        batch.metrics["credit/turns_mean"] = float(counts[batch.valid].float().mean()) if batch.valid.any() else 0.0
        batch.metrics["credit/turn_reward_mean"] = float(rewards[exists].mean()) if exists.any() else 0.0

    def _rebn(self, rewards: torch.Tensor, counts: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """`credo.algos.rebn` over every rank's kept transitions (GEM all-reduces the statistics); this rank's rows."""
        rank, _ = rank_and_world()
        (B, K), T = rewards.shape, ids.shape[1]
        k_all, t_all = (int(x) for x in all_reduce_max(torch.tensor([K, T])))
        turns = (torch.arange(K)[None, :] < counts[:, None]) & valid[:, None]
        ids = torch.where(valid[:, None], ids, torch.full_like(ids, -1))
        all_rewards, all_turns = gather_rows(rewards, k_all), gather_rows(turns, k_all)
        all_ids = all_gather_cat(F.pad(ids, (0, t_all - T), value=-1))
        adv = algos.rebn(all_rewards, all_turns, all_ids, gamma=self.gamma, normalize=self.credit == "mc_rebn",
                         eps=self.eps)
        return adv[rank * B:(rank + 1) * B, :T]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def turn_credit(ctx, s: TurnCreditSettings | None = None, **kwargs) -> TurnCredit:
    """stages.advantage: turn_credit; stages.advantage_kwargs (`TurnCreditSettings`, or the same as keywords):
    credit (mc_rebn, mc, grpo or ipa), gamma (per-turn discount), eps (ReBN)."""
    s = stage_settings(TurnCreditSettings, s, kwargs, "stages.advantage_kwargs")
    credit, gamma, eps = s.credit, s.gamma, s.eps
    if credit not in CREDITS:
        raise ConfigError(f"config key 'stages.advantage_kwargs.credit' = {credit!r}: expected one of {', '.join(CREDITS)}")
    if not 0 <= gamma <= 1:
        raise ConfigError(f"config key 'stages.advantage_kwargs.gamma' = {gamma!r} is out of range: expected in [0, 1]")
    if credit == "grpo" and ctx.rollout.get("group_size", 2) < 2:
        raise ConfigError("config key 'rollout.group_size' must be >= 2 with credit: grpo (the group baseline)")
    return TurnCredit(credit, gamma, eps)

