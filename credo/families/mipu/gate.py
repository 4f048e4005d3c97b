"""MIPU step 2 on the trainer (arXiv 2606.29526): accept-or-roll-back of each update, as a step hook.

    hooks(ctx, parts)          -> [StepGate]  built from the recipe's `mipu:` section when the family is active
    gate.before_step(step)     snapshot of the whole trainer state
    ... rollout, advantages, update, sync the candidate to the rollout engine ...
    gate.after_sync(step, b)   -> mipu/*: validate the candidate, accept it or roll back

Step 1 (the `mipu` policy loss) lives in `credo.algos.mipu`; the formulas of step 2 (`mipu_t_post`,
`mipu_threshold`, `mipu_accept`) too. This module runs them on the trainer: validation rollouts from the
synced candidate mu_{k+1} on held-out training prompts, the candidate trainer's log-probs pi_{k+1} of the same
tokens, group-relative advantages, and on rejection `TrainState.restore` of the snapshot (policy, optimizer,
LR schedule, RNG, counters, critics) and a re-sync of the rollout engine.
"""

from __future__ import annotations

import collections

import torch

from credo import algos
from credo.family import FamilyParts
from credo.algos.mipu import mipu_accept, mipu_t_post, mipu_threshold
from credo.distributed.engine import all_reduce_sum
from credo.tasks.render import encode_prompts
from credo.train.batch import Batch, pack
from credo.train.rollout import step_seed

WINDOW = 100
"""Steps in the moving window of `mipu/rollback_rate` (the paper's 100-step window)."""
VAL_SALT = -1_000_000
"""Seed salts of the validation samples, disjoint from the training samples' (>= 0)."""


class StepGate:
    """MIPU step 2 (`mode='mipu'`), the random-rollback control (`mode='random'`), or off (`mode=None`).

    Args:
        state: the run's `TrainState` (snapshot / restore).
        source: the rollout source (`sync(model, step)` re-syncs the engine after a rollback).
        backend: the rollout engine, for the validation samples.
        reward: the reward stage (scores the validation batch).
        scorer: the policy scorer (the candidate's log-probs of the validation tokens).
        engine: the policy's DeepSpeed engine.
        val_problems: the held-out training problems validated on every step.
        sampling: max_new_tokens, temperature, top_p of the rollouts.
    """

    def __init__(self, *, mode: str | None, state, source, backend=None, reward=None, scorer=None, engine=None,
                 tokenizer=None, render=None, val_problems=(), val_group_size: int = 4, c_start: float = 0.0,
                 c_end: float = 0.0, anneal_steps: int = 100, rollback_prob: float = 0.0, seed: int = 0,
                 rank: int = 0, world: int = 1, sampling: dict | None = None):
        if mode not in (None, "mipu", "random"):
            raise ValueError(f"mode is {mode!r}, expected None, 'mipu' or 'random'")
        if mode == "mipu":
            if len(val_problems) < 1 or val_group_size < 2:
                raise ValueError(f"a validation set of {len(val_problems)} prompts x {val_group_size} responses "
                                 "cannot form one group: expected mipu.val_prompts >= 1 and mipu.val_group_size >= 2")
            if len(val_problems) % world:
                raise ValueError(f"mipu.val_prompts = {len(val_problems)} must be divisible by the number of "
                                 f"processes ({world})")
        self.mode, self.state, self.source, self.backend = mode, state, source, backend
        self.reward, self.scorer, self.engine, self.tokenizer, self.render = reward, scorer, engine, tokenizer, render
        self.val_problems, self.G = list(val_problems), val_group_size
        self.c_start, self.c_end, self.anneal_steps = c_start, c_end, anneal_steps
        self.rollback_prob, self.seed, self.rank, self.world = rollback_prob, seed, rank, world
        self.sampling = dict(sampling or {})
        self.decisions: collections.deque = collections.deque(maxlen=WINDOW)  # 1 = rolled back

    # ---- Stateful: the rollback window survives resume; a restore of a snapshot puts it back, then the
    # step's own decision is appended
    def state_dict(self) -> dict:
        return {"decisions": list(self.decisions)}

    def load_state_dict(self, state: dict) -> None:
        self.decisions = collections.deque(state.get("decisions", []), maxlen=WINDOW)

    # ---- the step hook (credo.train.hooks): a snapshot before the step, the decision after the sync
    name = "mipu"
    """Its key in the trainer state and its timing metric, perf/mipu_s."""

    def before_step(self, step: int) -> None:
        self._snap = self.snapshot()

    def after_sync(self, step: int, batch=None) -> dict[str, float]:
        snap, self._snap = getattr(self, "_snap", None), None
        return self.decide(step, snap)

    def snapshot(self) -> dict | None:
        """The whole trainer state before the step (None when the gate is off: nothing is copied)."""
        return None if self.mode is None else self.state.snapshot()

    def decide(self, step: int, snap: dict | None) -> dict[str, float]:
        """Accept the synced candidate or roll back to `snap`; returns the step's `mipu/*` metrics."""
        if self.mode is None:
            return {}
        metrics: dict[str, float] = {}
        if self.mode == "random":
            gen = torch.Generator().manual_seed(step_seed(self.seed, step, VAL_SALT - 1))
            accept = bool(torch.rand((), generator=gen) >= self.rollback_prob)
        else:
            c_k = mipu_threshold(step - 1, self.c_start, self.c_end, self.anneal_steps)
            t_post, val_reward = self.t_post(step)
            accept = mipu_accept(t_post, c_k)
            metrics = {"mipu/t_post": t_post, "mipu/c_k": c_k, "mipu/val_reward_mean": val_reward}
        if not accept:
            self.state.restore(snap)
            self.source.sync(self.engine.module, step)  # the engine takes the restored weights again
        self.decisions.append(0 if accept else 1)
        return {**metrics, "mipu/accepted": float(accept),
                "mipu/rollback_rate": sum(self.decisions) / len(self.decisions)}

    @torch.no_grad()
    def t_post(self, step: int) -> tuple[float, float]:
        """T_post of the candidate on this rank's share of the validation prompts, averaged over all ranks;
        also the validation reward mean."""
        per_rank = len(self.val_problems) // self.world
        mine = range(self.rank * per_rank, (self.rank + 1) * per_rank)
        problems = [self.val_problems[i] for i in mine]
        prompt_ids = encode_prompts(self.tokenizer, self.render, problems)
        prompts = [ids for ids in prompt_ids for _ in range(self.G)]
        seeds = [step_seed(self.seed, step, VAL_SALT + i * self.G + g) for i in mine for g in range(self.G)]
        samples = self.backend.generate(prompts, seeds=seeds, **self.sampling)
        batch = Batch(samples=samples, problems=[p for p in problems for _ in range(self.G)],
                      group_ids=torch.tensor([i for i in mine for _ in range(self.G)]), step=step)
        self.reward(batch)
        ids, attn, resp, mu = pack(samples, self.tokenizer.pad_token_id)
        dev = next(self.engine.module.parameters()).device
        mask = (resp & batch.valid[:, None]).to(dev)
        pi, _ = self.scorer(self.engine.module, ids.to(dev), attn.to(dev), mask, with_entropy=False)
        rewards = batch.rewards.double()
        adv = algos.normalize_rewards(rewards, batch.group_ids, mean_scope="group", std_scope="group")
        rows = mask.any(-1).cpu()
        local = mipu_t_post(pi, mu.to(dev), adv.to(dev).float(), mask) if bool(rows.any()) else 0.0
        n = float(rows.sum())
        valid = batch.valid
        tot = all_reduce_sum(torch.tensor([local * n, n, float(rewards[valid].sum()), float(valid.sum())],
                                          dtype=torch.float64))
        if tot[1] == 0:
            raise ValueError(f"step {step}: no validation response has a valid reward and a token; "
                             "T_post cannot be estimated (check the reward function)")
        return float(tot[0] / tot[1]), float(tot[2] / tot[3])


def hooks(ctx, parts) -> list[StepGate]:
    """MIPU step 2 (mipu.enabled) or the random-rollback control (mipu.random_rollback), whose rollback window is
    part of the trainer state (checkpointed, and put back by a restore)."""
    m, ro, task = ctx.section, ctx.rollout, ctx.task
    mode = "mipu" if m.enabled else "random"
    n = len(task)
    gate = StepGate(mode=mode, state=parts.state, source=parts.source, backend=ctx.backend, reward=parts.reward,
                    scorer=parts.scorer, engine=ctx.engine, tokenizer=ctx.tokenizer, render=ctx.render,
                    val_problems=[task.train(i) for i in range(n - m.val_prompts, n)] if m.enabled else [],
                    val_group_size=m.val_group_size, c_start=m.c_start, c_end=m.c_end, anneal_steps=m.anneal_steps,
                    rollback_prob=m.random_rollback, seed=ctx.seed, rank=ctx.rank, world=ctx.world,
                    sampling=dict(max_new_tokens=ro["max_new_tokens"], temperature=ro["temperature"],
                                  top_p=ro["top_p"]))
    return [gate]


PARTS = FamilyParts(hooks=hooks)
"""The family's build-time parts (`credo.family`): the accept-or-roll-back gate."""
