"""CE-RM: a pointwise generative judge trained by a two-stage rollout with unified criteria (arXiv 2601.20327).

Per instance (query q, chosen y+, rejected y-) one step samples

    stage 1   K criteria lists c_1..c_K from the query alone             (K = n_criteria, default 4)
    stage 2   under each c_k, E evaluations of y+ and E of y-             (E = evals_per_response, default 2)
              each a 0-10 score in the last \\boxed{}                     (4 x 2 x 2 = 16 evaluations)

= K + 2KE trajectories (20 by default). Rewards (inferred: the paper's Eq. 8-10 were not available, spec 07):

    evaluation of y+ under c_k, score s:  mean over the y- evaluations under c_k of 1[s > s-]   (ties and
                                          unparseable scores count as wrong)
    evaluation of y- under c_k, score s:  mean over the y+ evaluations under c_k of 1[s < s+]
    criteria c_k:                         the discrimination accuracy of its evaluations: mean over
                                          all (y+, y-) evaluation pairs under c_k of 1[s+ > s-]

Advantages are group-normalised separately within three groups per instance (criteria trajectories,
chosen evaluations, rejected evaluations; confirmed by the spec's reading note): `ce_rm_group_ids` gives
each its own group id, so the outcome estimator `grpo` normalises at both stages. The evaluation
prompt contains the criteria text as context: only the turn-2 output is trained on.
"""

from __future__ import annotations

import torch

from credo.distributed.rollout import Sample
from credo.families.judges.parse import parse_pointwise_score
from credo.families.judges.prompts import pointwise_prompt
from credo.families.judges.tasks import COMPACT_CRITERIA, render_criteria
from credo.families.judges.prompts import COMPACT_CRITERIA_POINTWISE
from credo.tasks import Problem
from credo.families.judges.config import CERMRolloutSettings
from credo.train.batch import Batch
from credo.train.registry import stage_settings
from credo.train.rollout import step_problem_indices, step_seed

CRITERIA, CHOSEN, REJECTED = 0, 1, 2


def ce_rm_layout(instances: list[int], K: int, E: int) -> list[tuple[int, int, int]]:
    """(instance, kind, k) of each trajectory, in batch order: per instance its K criteria, then for each
    k the E chosen and E rejected evaluations."""
    rows = []
    for n in instances:
        rows += [(n, CRITERIA, k) for k in range(K)]
        for k in range(K):
            rows += [(n, CHOSEN, k)] * E + [(n, REJECTED, k)] * E
    return rows


def ce_rm_group_ids(layout: list[tuple[int, int, int]]) -> torch.Tensor:
    """[N] group ids: 3 * instance + kind (criteria, chosen evaluations, rejected evaluations of an instance)."""
    return torch.tensor([3 * n + kind for n, kind, _ in layout], dtype=torch.long)


def discrimination_rewards(chosen: list[list[float | None]], rejected: list[list[float | None]]):
    """Stage rewards of one instance from its evaluation scores (None = unparseable).

    Args:
        chosen, rejected: [K][E] scores of the chosen / rejected response under each criteria list.

    Returns:
        (criteria [K], chosen [K][E], rejected [K][E]) rewards in [0, 1].
    """
    crit, rc, rr = [], [], []
    for sc, sr in zip(chosen, rejected):
        def beats(a, b):
            return a is not None and b is not None and a > b

        rc.append([sum(beats(a, b) for b in sr) / len(sr) for a in sc])
        rr.append([sum(beats(a, b) for a in sc) / len(sc) for b in sr])
        crit.append(sum(beats(a, b) for a in sc for b in sr) / (len(sc) * len(sr)))
    return crit, rc, rr


class TwoStageRollout:
    """CE-RM's two-stage rollout over the instances of a `CriteriaJudgeTask` (task: ce_rm_arithmetic)."""

    def __init__(self, default, task, tokenizer, backend, *, seed: int, prompts_per_step: int, n_criteria: int,
                 evals_per_response: int, criteria_max_new_tokens: int, eval_max_new_tokens: int, temperature: float,
                 top_p: float, rank: int = 0, world: int = 1, criteria_template: str = COMPACT_CRITERIA,
                 eval_template: str = COMPACT_CRITERIA_POINTWISE):
        self.default, self.task, self.tok, self.backend = default, task, tokenizer, backend
        self.seed, self.P, self.K, self.E = seed, prompts_per_step, n_criteria, evals_per_response
        self.crit_len, self.eval_len, self.temperature, self.top_p = (criteria_max_new_tokens, eval_max_new_tokens,
                                                                      temperature, top_p)
        self.rank, self.world = rank, world
        self.criteria_template, self.eval_template = criteria_template, eval_template

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]

    def rollout(self, step: int) -> Batch:
        K, E = self.K, self.E
        idx = step_problem_indices(self.seed, step, len(self.task), self.P)
        per_rank = self.P // self.world
        mine = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))
        inst = {i: self.task.instance(idx[i]) for i in mine}
        # stage 1: K criteria per query, from the query alone (one generate call)
        crit_prompts = [render_criteria(inst[i][0], self.criteria_template) for i in mine for _ in range(K)]
        seeds = [step_seed(self.seed, step, 1 + j) for j in range(len(crit_prompts))]
        crit = self.backend.generate(self._encode(crit_prompts), max_new_tokens=self.crit_len,
                                     temperature=self.temperature, top_p=self.top_p, seeds=seeds)
        crit_text = self.tok.batch_decode([s.response_ids for s in crit], skip_special_tokens=True)
        # stage 2: under each criteria list, E evaluations of the chosen and E of the rejected response
        layout = ce_rm_layout(mine, K, E)
        eval_rows = [row for row in layout if row[1] != CRITERIA]
        eval_prompts = []
        for n, kind, k in eval_rows:
            q, chosen, rejected = inst[n]
            c = crit_text[mine.index(n) * K + k]
            eval_prompts.append(pointwise_prompt(q, chosen if kind == CHOSEN else rejected, template=self.eval_template,
                                                 criteria=c))
        seeds = [step_seed(self.seed, step, 1_000_003 + j) for j in range(len(eval_prompts))]
        evals = iter(self.backend.generate(self._encode(eval_prompts), max_new_tokens=self.eval_len,
                                           temperature=self.temperature, top_p=self.top_p, seeds=seeds))
        crits = iter(crit)
        samples: list[Sample] = []
        problems = []
        for n, kind, k in layout:
            s = next(crits) if kind == CRITERIA else next(evals)
            s.meta.update(ce_rm=(n, kind, k))
            samples.append(s)
            problems.append(Problem(prompt=inst[n][0], answer="", meta={"ce_rm": (n, kind, k)}))
        return Batch(samples=samples, problems=problems, group_ids=ce_rm_group_ids(layout), step=step)

    def generate(self, prompts, *, temperature, seeds):
        return self.default.generate(prompts, temperature=temperature, seeds=seeds)

    def sync(self, model, step: int) -> None:
        self.backend.sync_weights(model, step)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        self.backend.close()


class CERMReward:
    """Discrimination rewards of a two-stage batch (see the module docstring); unparseable scores are wrong."""

    def __init__(self, tokenizer, *, K: int, E: int):
        self.tok, self.K, self.E = tokenizer, K, E

    def __call__(self, batch: Batch) -> None:
        texts = self.tok.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=True)
        rows = [p.meta["ce_rm"] for p in batch.problems]
        scores: dict = {}
        n_eval = bad = 0
        for (n, kind, k), t in zip(rows, texts):
            if kind != CRITERIA:
                s = parse_pointwise_score(t)
                n_eval, bad = n_eval + 1, bad + (s is None)
                scores.setdefault((n, kind, k), []).append(s)
        rewards, seen = [], {}
        per_instance = {}
        for n in dict.fromkeys(r[0] for r in rows):
            ch = [scores[(n, CHOSEN, k)] for k in range(self.K)]
            rj = [scores[(n, REJECTED, k)] for k in range(self.K)]
            per_instance[n] = discrimination_rewards(ch, rj)
        for n, kind, k in rows:
            crit, rc, rr = per_instance[n]
            if kind == CRITERIA:
                rewards.append(crit[k])
                continue
            j = seen.get((n, kind, k), 0)
            seen[(n, kind, k)] = j + 1
            rewards.append((rc if kind == CHOSEN else rr)[k][j])
        batch.rewards = torch.tensor(rewards)
        batch.valid = torch.ones(len(rewards), dtype=torch.bool)
        crit_rewards = [c for n in per_instance for c in per_instance[n][0]]
        batch.metrics["reward/failures"] = 0
        batch.metrics["reward/timeouts"] = 0
        batch.metrics["reward/unparseable_frac"] = bad / n_eval if n_eval else 0.0
        batch.metrics["reward/criteria_accuracy"] = sum(crit_rewards) / len(crit_rewards) if crit_rewards else 0.0

    def close(self) -> None:
        pass


def two_stage_source(ctx, s: CERMRolloutSettings | None = None, **kwargs) -> TwoStageRollout:
    """stages.rollout: ce_rm_two_stage; stages.rollout_kwargs are `CERMRolloutSettings` (n_criteria,
    evals_per_response, criteria_max_new_tokens, eval_max_new_tokens), or the same as keywords."""
    from credo.errors import ConfigError

    s = stage_settings(CERMRolloutSettings, s, kwargs, "stages.rollout_kwargs")
    n_criteria, evals_per_response = s.n_criteria, s.evals_per_response
    if not hasattr(ctx.task, "instance"):
        raise ConfigError("config key 'stages.rollout' = 'ce_rm_two_stage' needs task.name = 'ce_rm_arithmetic' "
                          "(a task with (query, chosen, rejected) instances)")
    ro = ctx.rollout
    if ro["group_size"] != n_criteria * (1 + 2 * evals_per_response):
        raise ConfigError(f"config key 'rollout.group_size' = {ro['group_size']}: expected n_criteria * (1 + 2 * "
                          f"evals_per_response) = {n_criteria * (1 + 2 * evals_per_response)}, the trajectories of one "
                          "instance (the update's batch size counts on it)")
    return TwoStageRollout(ctx.default, ctx.task, ctx.tokenizer, ctx.backend, seed=ctx.seed,
                           prompts_per_step=ro["prompts_per_step"], n_criteria=n_criteria,
                           evals_per_response=evals_per_response, criteria_max_new_tokens=s.criteria_max_new_tokens,
                           eval_max_new_tokens=s.eval_max_new_tokens, temperature=ro["temperature"], top_p=ro["top_p"],
                           rank=ctx.rank, world=ctx.world)



def ce_rm_reward(ctx) -> CERMReward:
    """stages.reward: ce_rm; the criteria and evaluation counts are the two-stage rollout's (set once, in
    stages.rollout_kwargs)."""
    return CERMReward(ctx.tokenizer, K=ctx.source.K, E=ctx.source.E)
