"""RM-NLHF: training a generative judge with natural-language human feedback (arXiv 2601.07349).

The policy here IS the judge (task `judge_arithmetic`, pairwise or pointwise, `critique: true`), trained by
GRPO on

    R = R_outcome + lam * R_process,     R_outcome = 1[label right] (the task's verifier)
    R_process = sim(judge critique, human critique)          items with a human critique
              = MetaRM(question, critique)                   items without one (when metarm is on, else 0)

With `gate_on_outcome` the process term counts only when the label is right (the spec leaves open whether
the paper gates; off by default). The share of items with a human critique is the task's
`task.kwargs.human_critique_frac`; lam, the similarity and MetaRM are `stages.reward_kwargs` of the
reward stage `rm_nlhf`.

MetaRM (inferred form): the paper's MetaRM is an LM with a scalar head trained on similarity scores of
sampled critiques, updated online after each policy step. Here it is a small MLP over hashed character
n-gram features of (question, critique), updated online each step on that step's human-critique samples
(targets: their similarity), then asked for the others: it tracks the policy's current critiques, which
is the point of the online variant, and trains on CPU in milliseconds.
"""

from __future__ import annotations

import zlib

import torch

from credo.families.judges.config import RMNLHFSettings
from credo.families.judges.critique_similarity import make_similarity
from credo.families.judges.tasks import critique_names_error, critique_of
from credo.train.batch import Batch
from credo.train.registry import stage_settings


def rm_nlhf_rewards(outcome: torch.Tensor, similarity: torch.Tensor, has_human: torch.Tensor,
                    predicted: torch.Tensor | None, lam: float, gate_on_outcome: bool = False) -> torch.Tensor:
    """R = R_outcome + lam * R_process per sample.

    Args:
        outcome: [B] float, 1[label right].
        similarity: [B] float in [0, 1], sim(critique, human critique) (read where has_human).
        has_human: [B] bool, the item has a human critique.
        predicted: [B] float, MetaRM's predicted process reward (read where not has_human), or None (then 0).
        lam: weight of the process reward.
        gate_on_outcome: the process term counts only where outcome > 0.

    Returns:
        [B] float rewards.
    """
    other = torch.zeros_like(similarity) if predicted is None else predicted.to(similarity.dtype)
    process = torch.where(has_human, similarity, other)
    if gate_on_outcome:
        process = process * (outcome > 0).to(process.dtype)
    return outcome + lam * process


def text_features(texts: list[str], dim: int = 256, n: int = 3) -> torch.Tensor:
    """[N, dim] hashed character n-gram counts (crc32, stable across processes), L2-normalised rows."""
    out = torch.zeros(len(texts), dim)
    for i, t in enumerate(texts):
        t = f"^{t}$"
        for k in range(max(len(t) - n + 1, 1)):
            out[i, zlib.crc32(t[k:k + n].encode()) % dim] += 1.0
    return torch.nn.functional.normalize(out, dim=-1)


class MetaRM(torch.nn.Module):
    """Predicts the process reward sim(critique, human critique) in [0, 1] from (context, critique) features."""

    def __init__(self, dim: int = 256, hidden: int = 32, lr: float = 1e-2, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.net = torch.nn.Sequential(torch.nn.Linear(2 * dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.opt = torch.optim.Adam(self.parameters(), lr=lr)

    def features(self, contexts: list[str], critiques: list[str]) -> torch.Tensor:
        return torch.cat([text_features(contexts, self.dim), text_features(critiques, self.dim)], -1)

    def predict(self, contexts: list[str], critiques: list[str]) -> torch.Tensor:
        """[N] predictions in [0, 1]."""
        if not critiques:
            return torch.zeros(0)
        with torch.no_grad():
            return torch.sigmoid(self.net(self.features(contexts, critiques))[:, 0])

    def update(self, contexts: list[str], critiques: list[str], targets: torch.Tensor, steps: int = 20) -> float:
        """`steps` Adam steps of MSE on the sigmoid output against `targets` [N]; returns the MSE before them."""
        if not critiques:
            return float("nan")
        x, y = self.features(contexts, critiques), targets.float()
        first = None
        for _ in range(steps):
            loss = torch.mean((torch.sigmoid(self.net(x)[:, 0]) - y) ** 2)
            first = loss.item() if first is None else first
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return first


class RMNLHFReward:
    """Outcome reward from `outcome` (the task's verifier stage) plus lam * the critique-similarity process reward."""

    def __init__(self, outcome, tokenizer, *, lam: float, similarity, gate_on_outcome: bool = False,
                 metarm: MetaRM | None = None, metarm_steps: int = 20):
        self.outcome, self.tok, self.lam, self.sim = outcome, tokenizer, lam, similarity
        self.gate, self.metarm, self.metarm_steps = gate_on_outcome, metarm, metarm_steps

    def __call__(self, batch: Batch) -> None:
        self.outcome(batch)  # rewards = 1[label right], valid, failures
        texts = self.tok.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=True)
        critiques = [critique_of(t) for t in texts]
        contexts = [p.meta.get("question", "") for p in batch.problems]
        human = torch.tensor([bool(p.meta.get("has_human_critique")) for p in batch.problems])
        sim = torch.zeros(len(texts))
        idx = human.nonzero()[:, 0].tolist()
        if idx:
            sim[idx] = torch.tensor(self.sim([critiques[i] for i in idx], [batch.problems[i].meta["critique"] for i in idx]),
                                    dtype=sim.dtype)
        predicted = None
        if self.metarm is not None:
            rest = (~human).nonzero()[:, 0].tolist()
            mse = self.metarm.update([contexts[i] for i in idx], [critiques[i] for i in idx], sim[idx], self.metarm_steps)
            predicted = torch.zeros(len(texts))
            if rest:
                predicted[rest] = self.metarm.predict([contexts[i] for i in rest], [critiques[i] for i in rest])
            batch.metrics["reward/metarm_mse"] = mse
        outcome = batch.rewards.float()
        batch.rewards = rm_nlhf_rewards(outcome, sim, human, predicted, self.lam, self.gate)
        ok = batch.valid
        right = ok & (outcome > 0)
        names = torch.tensor([critique_names_error(t, p) for t, p in zip(texts, batch.problems)])
        batch.metrics["reward/outcome_mean"] = float(outcome[ok].mean()) if ok.any() else float("nan")
        batch.metrics["reward/similarity_mean"] = float(sim[human & ok].mean()) if (human & ok).any() else float("nan")
        batch.metrics["reward/critique_correct_frac"] = float(names[right].float().mean()) if right.any() else float("nan")

    # ---- Stateful: the online MetaRM (its weights and Adam moments) is part of the trainer state, so a resume and a
    # rollback (MIPU) put it back with the policy
    def state_dict(self) -> dict:
        if self.metarm is None:
            return {}
        return {"metarm": self.metarm.state_dict(), "metarm_opt": self.metarm.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.metarm is None or not state:
            return
        self.metarm.load_state_dict(state["metarm"])
        self.metarm.opt.load_state_dict(state["metarm_opt"])

    def close(self) -> None:
        self.outcome.close()


def rm_nlhf_stage(ctx, s: RMNLHFSettings | None = None, **kwargs) -> RMNLHFReward:
    """stages.reward: rm_nlhf, over the recipe's verifier; stages.reward_kwargs are `RMNLHFSettings` (lam,
    similarity: auto|embedding|rouge_l, gate_on_outcome, metarm, metarm_lr, metarm_steps), or the same as keywords."""
    s = stage_settings(RMNLHFSettings, s, kwargs, "stages.reward_kwargs")
    if ctx.default is None:
        from credo.errors import ConfigError

        raise ConfigError(f"config key 'stages.reward' = 'rm_nlhf' needs the task's verifier (its outcome reward); "
                          f"task '{ctx.task_config.name}' has none")
    sim, _ = make_similarity(s.similarity)
    model = MetaRM(lr=s.metarm_lr, seed=ctx.seed) if s.metarm else None
    return RMNLHFReward(ctx.default, ctx.tokenizer, lam=s.lam, similarity=sim, gate_on_outcome=s.gate_on_outcome,
                        metarm=model, metarm_steps=s.metarm_steps)
