"""CE-RM: discrimination rewards by hand, grouped advantages at both stages against a naive loop, the
two-stage rollout's layout and its generate calls."""

import math
import random

import pytest
import torch

from credo.algos.advantages import grpo
from credo.distributed.rollout import Sample
from credo.families.judges.tasks import CriteriaJudgeTask
from credo.train.batch import Batch
from credo.families.judges.ce_rm import (CHOSEN, CRITERIA, REJECTED, CERMReward, TwoStageRollout, ce_rm_group_ids,
                               ce_rm_layout, discrimination_rewards)
from credo.tasks import Problem
from tests.fakes import CharTok


def test_discrimination_rewards_by_hand():
    # criteria 0: chosen scored 8, 6; rejected 6, None -> pairs (8>6 yes, 8>None no, 6>6 tie no, 6>None no)
    crit, rc, rr = discrimination_rewards([[8, 6], [10, 10]], [[6, None], [0, 0]])
    assert crit == [0.25, 1.0]
    assert rc == [[0.5, 0.0], [1.0, 1.0]]
    assert rr == [[0.5, 0.0], [1.0, 1.0]]  # rejected 6 is below chosen 8 only; None beats nothing


def fake_batch(layout, texts):
    samples = [Sample([1], [ord(c) for c in t], [1] * len(t), [0.0] * len(t), True) for t in texts]
    problems = [Problem("q", "", {"ce_rm": row}) for row in layout]
    return Batch(samples=samples, problems=problems, group_ids=ce_rm_group_ids(layout))


def naive_ce_rm_advantages(layout, scores, K, E, eps=1e-6):
    """Rewards and advantages by loops: each trajectory's reward, then per (instance, stage-group) mean/std."""
    rewards = []
    for n, kind, k in layout:
        ch = [scores[(n, CHOSEN, k, j)] for j in range(E)]
        rj = [scores[(n, REJECTED, k, j)] for j in range(E)]
        if kind == CRITERIA:
            wins = 0
            for a in ch:
                for b in rj:
                    wins += a is not None and b is not None and a > b
            rewards.append(wins / (E * E))
        else:
            j = sum(1 for m, kd, kk in layout[:len(rewards)] if (m, kd, kk) == (n, kind, k))
            mine = scores[(n, kind, k, j)]
            others = rj if kind == CHOSEN else ch
            won = 0
            for o in others:
                if mine is not None and o is not None and (mine > o if kind == CHOSEN else mine < o):
                    won += 1
            rewards.append(won / E)
    adv = []
    for i, (n, kind, _) in enumerate(layout):
        group = [rewards[j] for j, (m, kd, _) in enumerate(layout) if m == n and kd == kind]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        adv.append((rewards[i] - mean) / (std + eps))
    return rewards, adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_advantages_at_both_stages_match_a_naive_loop(seed):
    rng = random.Random(seed)
    K, E = 4, 2
    layout = ce_rm_layout([5, 9], K, E)
    assert len(layout) == 2 * (4 + 16)
    texts, scores, count = [], {}, {}
    for n, kind, k in layout:
        if kind == CRITERIA:
            texts.append("=052")
            continue
        j = count.get((n, kind, k), 0)
        count[(n, kind, k)] = j + 1
        s = rng.choice([None, 0, 2.5, 5, 7, 10])
        scores[(n, kind, k, j)] = s
        texts.append("junk" if s is None else f"\\boxed{{4}} \\boxed{{{s}}}")
    batch = fake_batch(layout, texts)
    CERMReward(CharTok(), K=K, E=E)(batch)
    want_r, want_a = naive_ce_rm_advantages(layout, scores, K, E)
    assert batch.rewards.tolist() == pytest.approx(want_r)
    mask = torch.ones(len(layout), 3, dtype=torch.bool)
    adv = grpo(batch.rewards.double(), batch.group_ids, mask)
    assert adv[:, 0].tolist() == pytest.approx(want_a, abs=1e-6)
    n_eval = sum(1 for r in layout if r[1] != CRITERIA)
    assert batch.metrics["reward/unparseable_frac"] == pytest.approx(
        sum(1 for v in scores.values() if v is None) / n_eval)


class Backend:
    def __init__(self):
        self.calls = []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        self.calls.append(["".join(chr(i) for i in p) for p in prompts])
        return [Sample(p, [ord("7")], [1], [0.0], True) for p in prompts]

    def close(self):
        pass


def test_two_stage_rollout_generates_criteria_from_the_query_then_evaluations_under_them():
    task = CriteriaJudgeTask(200, 10, 0, max_operand=9, fixed_width=True)
    be = Backend()
    src = TwoStageRollout(None, task, CharTok(), be, seed=0, prompts_per_step=2, n_criteria=4, evals_per_response=2,
                          criteria_max_new_tokens=4, eval_max_new_tokens=8, temperature=1.0, top_p=1.0)
    batch = src.rollout(1)
    assert len(be.calls) == 2 and len(be.calls[0]) == 2 * 4 and len(be.calls[1]) == 2 * 16
    assert all(p.endswith("#") and "|" not in p for p in be.calls[0])  # query only
    assert all(p.startswith("7|") for p in be.calls[1])  # the generated criteria "7" are the context
    assert len(batch) == 40 and batch.group_ids.unique().numel() == 6
    kinds = [p.meta["ce_rm"][1] for p in batch.problems[:20]]
    assert kinds.count(CRITERIA) == 4 and kinds.count(CHOSEN) == 8 and kinds.count(REJECTED) == 8


def test_two_stage_source_samples_with_the_recipes_top_p_and_temperature():
    from types import SimpleNamespace

    from credo.families.judges.ce_rm import two_stage_source

    seen = []

    class Recording(Backend):
        def generate(self, prompts, **kw):
            seen.append((kw["temperature"], kw["top_p"]))
            return super().generate(prompts, **kw)

    ctx = SimpleNamespace(default=None, task=CriteriaJudgeTask(200, 10, 0, max_operand=9, fixed_width=True),
                          tokenizer=CharTok(), backend=Recording(), seed=0, rank=0, world=1,
                          rollout={"prompts_per_step": 1, "group_size": 4 * 5, "temperature": 0.8, "top_p": 0.9})
    two_stage_source(ctx, n_criteria=4, evals_per_response=2).rollout(1)
    assert seen == [(0.8, 0.9), (0.8, 0.9)]


def test_an_empty_shard_scores_no_criteria():
    batch = fake_batch([], [])
    CERMReward(CharTok(), K=2, E=1)(batch)
    assert batch.rewards.numel() == 0 and batch.metrics["reward/criteria_accuracy"] == 0.0
