"""CE-RM's stages in detail (credo.families.judges.ce_rm): the batch layout and group ids, the two-stage rollout's prompts,
seeds and sampling arguments on a scripted backend and a sharded step, the discrimination rewards and metrics of
a hand-scored batch, and the factories' defaults and config errors."""

import dataclasses

import pytest
import torch

from credo.config import ConfigError
from credo.distributed.rollout import Sample
from credo.tasks import Problem
from credo.train.batch import Batch
from credo.families.judges.ce_rm import (CHOSEN, CRITERIA, REJECTED, CERMReward, TwoStageRollout, ce_rm_group_ids, ce_rm_layout,
                               ce_rm_reward, two_stage_source)
from credo.train.registry import StageContext, resolve
from credo.train.rollout import step_problem_indices, step_seed
from tests.fakes import CharTok, recipe_with


class Backend:
    """Answers the j-th prompt of its c-th generate call with "<c:j>"; records every call."""

    def __init__(self):
        self.calls, self.synced, self.closed = [], [], 0

    def generate(self, prompts, **kw):
        c = len(self.calls)
        self.calls.append(dict(kw, prompts=["".join(chr(i) for i in p) for p in prompts]))
        return [Sample(list(p), [ord(ch) for ch in f"<{c}:{j}>"], [1] * 5, [0.0] * 5, True, meta={"j": j})
                for j, p in enumerate(prompts)]

    def sync_weights(self, model, step):
        self.synced.append((model, step))

    def close(self):
        self.closed += 1


class Instances:
    """A task of `n` (query, chosen, rejected) instances: ("q{i}=", "c{i}", "r{i}")."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def instance(self, i):
        return f"q{i}=", f"c{i}", f"r{i}"


def test_layout_and_group_ids_by_hand():
    layout = ce_rm_layout([2, 3], K=2, E=1)
    assert layout == [(2, CRITERIA, 0), (2, CRITERIA, 1), (2, CHOSEN, 0), (2, REJECTED, 0), (2, CHOSEN, 1),
                      (2, REJECTED, 1),
                      (3, CRITERIA, 0), (3, CRITERIA, 1), (3, CHOSEN, 0), (3, REJECTED, 0), (3, CHOSEN, 1),
                      (3, REJECTED, 1)]
    assert (CRITERIA, CHOSEN, REJECTED) == (0, 1, 2)
    ids = ce_rm_group_ids(layout)
    assert ids.dtype == torch.long and ids.tolist() == [6, 6, 7, 8, 7, 8, 9, 9, 10, 11, 10, 11]
    assert ce_rm_layout([0], K=1, E=2) == [(0, 0, 0), (0, 1, 0), (0, 1, 0), (0, 2, 0), (0, 2, 0)]


def test_the_second_rank_rolls_out_its_share_of_the_steps_instances():
    be, tok, task = Backend(), CharTok(), Instances()
    src = TwoStageRollout(None, task, tok, be, seed=3, prompts_per_step=4, n_criteria=2, evals_per_response=1,
                          criteria_max_new_tokens=5, eval_max_new_tokens=7, temperature=0.9, top_p=0.8, rank=1, world=2)
    batch = src.rollout(5)
    idx = step_problem_indices(3, 5, 10, 4)
    a, b = idx[2], idx[3]  # rank 1 of 2 takes the step's instances 2 and 3
    crit_call, eval_call = be.calls
    assert crit_call["prompts"] == [f"q{a}=#", f"q{a}=#", f"q{b}=#", f"q{b}=#"]
    assert crit_call["seeds"] == [step_seed(3, 5, 1 + j) for j in range(4)]
    assert (crit_call["max_new_tokens"], crit_call["temperature"], crit_call["top_p"]) == (5, 0.9, 0.8)
    # each evaluation sees the criteria of its (instance, k) as context
    assert eval_call["prompts"] == [f"<0:0>|q{a}=c{a}?", f"<0:0>|q{a}=r{a}?", f"<0:1>|q{a}=c{a}?", f"<0:1>|q{a}=r{a}?",
                                    f"<0:2>|q{b}=c{b}?", f"<0:2>|q{b}=r{b}?", f"<0:3>|q{b}=c{b}?", f"<0:3>|q{b}=r{b}?"]
    assert eval_call["seeds"] == [step_seed(3, 5, 1_000_003 + j) for j in range(8)]
    assert (eval_call["max_new_tokens"], eval_call["temperature"], eval_call["top_p"]) == (7, 0.9, 0.8)
    assert set(tok.encodes) == {False} and tok.decodes == [True]
    layout = ce_rm_layout([2, 3], 2, 1)
    texts = ["".join(map(chr, s.response_ids)) for s in batch.samples]
    assert texts == ["<0:0>", "<0:1>", "<1:0>", "<1:1>", "<1:2>", "<1:3>",
                     "<0:2>", "<0:3>", "<1:4>", "<1:5>", "<1:6>", "<1:7>"]
    assert [s.meta["ce_rm"] for s in batch.samples] == layout and batch.samples[3].meta["j"] == 1
    assert [p.meta for p in batch.problems] == [{"ce_rm": row} for row in layout]
    assert [p.prompt for p in batch.problems] == [f"q{a}="] * 6 + [f"q{b}="] * 6
    assert {p.answer for p in batch.problems} == {""}
    assert batch.group_ids.tolist() == ce_rm_group_ids(layout).tolist() and batch.step == 5


def test_the_rollout_renders_with_its_templates():
    be = Backend()
    src = TwoStageRollout(None, Instances(3), CharTok(), be, seed=0, prompts_per_step=1, n_criteria=1, evals_per_response=1,
                          criteria_max_new_tokens=2, eval_max_new_tokens=2, temperature=1.0, top_p=1.0,
                          criteria_template="C:{question}", eval_template="{question}/{response}/{criteria}")
    src.rollout(0)
    i = step_problem_indices(0, 0, 3, 1)[0]
    assert be.calls[0]["prompts"] == [f"C:q{i}="]
    assert be.calls[1]["prompts"] == [f"q{i}=/c{i}/<0:0>", f"q{i}=/r{i}/<0:0>"]


def test_the_rollouts_other_methods_delegate():
    class Default:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, **kw):
            self.calls.append((prompts, kw))
            return "evaluated"

    d, be = Default(), Backend()
    src = TwoStageRollout(d, Instances(), CharTok(), be, seed=0, prompts_per_step=1, n_criteria=1, evals_per_response=1,
                          criteria_max_new_tokens=2, eval_max_new_tokens=2, temperature=1.0, top_p=1.0)
    assert src.generate(["p"], temperature=0.3, seeds=[4]) == "evaluated"
    assert d.calls == [(["p"], {"temperature": 0.3, "seeds": [4]})]
    model = object()
    src.sync(model, 9)
    assert be.synced == [(model, 9)]
    assert src.state_dict() == {} and src.load_state_dict({"x": 1}) is None
    src.close()
    assert be.closed == 1


def batch_of(rows, texts):
    samples = [Sample([1], [ord(c) for c in t], [1] * len(t), [0.0] * len(t), True) for t in texts]
    return Batch(samples=samples, problems=[Problem("q", "", {"ce_rm": r}) for r in rows],
                 group_ids=ce_rm_group_ids(rows))


def box(s):
    return "junk" if s is None else f"\\boxed{{{s}}}"


def test_rewards_and_metrics_of_a_hand_scored_batch():
    rows = ce_rm_layout([0, 7], K=2, E=2)
    # instance 0: k=0 chosen 8, 6 vs rejected 6, junk; k=1 chosen 10, 11 (out of range) vs rejected 0, 9.5
    # instance 7: chosen 5 everywhere, rejected 4 everywhere
    scores0 = [8, 6, 6, None, 10, 11, 0, 9.5]
    scores7 = [5, 5, 4, 4, 5, 5, 4, 4]
    crit_text = "=052 \\boxed{x}"  # criteria are never parsed as scores
    texts = [crit_text] * 2 + [box(s) for s in scores0] + [crit_text] * 2 + [box(s) for s in scores7]
    tok = CharTok()
    batch = batch_of(rows, texts)
    CERMReward(tok, K=2, E=2)(batch)
    # k=0: 8 beats 6 (not junk) -> 0.5, 6 beats nothing -> 0; rejected 6 is below 8 only -> 0.5, junk -> 0;
    #      pairs won 1 of 4 -> criteria 0.25
    # k=1: 10 beats 0 and 9.5 -> 1, 11 is unparseable -> 0; rejected 0 and 9.5 are below 10 only -> 0.5 each;
    #      pairs won 2 of 4 -> criteria 0.5
    want = [0.25, 0.5, 0.5, 0.0, 0.5, 0.0, 1.0, 0.0, 0.5, 0.5] + [1.0] * 10
    assert batch.rewards.tolist() == want and batch.rewards.dtype == torch.float32
    assert batch.valid.dtype == torch.bool and batch.valid.tolist() == [True] * 20
    m = batch.metrics
    assert (m["reward/failures"], m["reward/timeouts"]) == (0, 0)
    assert m["reward/unparseable_frac"] == 2 / 16
    assert m["reward/criteria_accuracy"] == (0.25 + 0.5 + 1.0 + 1.0) / 4
    assert tok.decodes == [True]


def test_rewards_with_more_criteria_than_evaluations():
    rows = ce_rm_layout([1], K=3, E=1)
    # k=0: 3 vs 2 (right), k=1: 2 vs 3 (wrong), k=2: 4 vs 4 (tie: wrong)
    texts = ["c"] * 3 + [box(s) for s in (3, 2, 2, 3, 4, 4)]
    batch = batch_of(rows, texts)
    CERMReward(CharTok(), K=3, E=1)(batch)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert batch.metrics["reward/criteria_accuracy"] == 1 / 3 and batch.metrics["reward/unparseable_frac"] == 0.0
    CERMReward(CharTok(), K=1, E=1).close()


def ctx_for(group_size=20, **kw):
    recipe = recipe_with(run={"seed": kw.pop("seed", 0)},
                         rollout={"prompts_per_step": 2, "group_size": group_size, "temperature": 0.7, "top_p": 0.95})
    return StageContext(rank=kw.pop("rank", 0), world=kw.pop("world", 1), recipe=recipe, tokenizer=CharTok(),
                        task=kw.pop("task", Instances()), backend=kw.pop("backend", Backend()), default=kw.pop("default", None))


def test_two_stage_source_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^config key 'stages\.rollout' = 'ce_rm_two_stage' needs task\.name = "
                       r"'ce_rm_arithmetic' \(a task with \(query, chosen, rejected\) instances\)$"):
        two_stage_source(ctx_for(task=[1, 2, 3]))
    with pytest.raises(ConfigError, match=r"^config key 'stages\.rollout_kwargs\.n_criteria' = 0 is out of range: "
                                          r"expected >= 1$"):
        two_stage_source(ctx_for(), n_criteria=0)
    with pytest.raises(ConfigError, match=r"^config key 'stages\.rollout_kwargs\.evals_per_response' = 0 is out of "
                       r"range: expected >= 1$"):
        two_stage_source(ctx_for(), evals_per_response=0)
    with pytest.raises(ConfigError, match=r"^config key 'rollout\.group_size' = 20: expected n_criteria \* \(1 \+ 2 \* "
                       r"evals_per_response\) = 15, the trajectories of one instance \(the update's batch size counts "
                       r"on it\)$"):
        two_stage_source(ctx_for(), n_criteria=3)
    assert isinstance(two_stage_source(ctx_for(3), n_criteria=1, evals_per_response=1), TwoStageRollout)


def test_two_stage_source_defaults_and_the_recipes_settings():
    be = Backend()
    ctx = ctx_for(seed=4, rank=1, world=2, backend=be, default="the default source")
    src = two_stage_source(ctx)  # n_criteria 4, evals_per_response 2: 4 * (1 + 4) = 20
    assert src.default == "the default source" and src.tok is ctx.tokenizer and src.task is ctx.task
    batch = src.rollout(2)
    crit_call, eval_call = be.calls
    i = step_problem_indices(4, 2, 10, 2)[1]  # rank 1 of 2 with 2 prompts per step
    assert crit_call["prompts"] == [f"q{i}=#"] * 4 and len(eval_call["prompts"]) == 16
    assert crit_call["seeds"] == [step_seed(4, 2, 1 + j) for j in range(4)]
    assert (crit_call["max_new_tokens"], eval_call["max_new_tokens"]) == (8, 12)
    assert (eval_call["temperature"], eval_call["top_p"]) == (0.7, 0.95)
    assert len(batch) == 20 and batch.group_ids.tolist() == [3] * 4 + ([4, 4, 5, 5] * 4)
    src = two_stage_source(ctx_for(2 * (1 + 2 * 3)), n_criteria=2, evals_per_response=3, criteria_max_new_tokens=1,
                           eval_max_new_tokens=2)
    assert (src.K, src.E, src.crit_len, src.eval_len, src.P) == (2, 3, 1, 2, 2)


def test_ce_rm_reward_takes_its_counts_from_the_two_stage_rollout():
    ctx = ctx_for()
    ctx = dataclasses.replace(ctx, source=two_stage_source(ctx))
    r = ce_rm_reward(ctx)
    assert (r.K, r.E) == (4, 2) and r.tok is ctx.tokenizer  # the rollout's defaults
    ctx = dataclasses.replace(ctx, source=two_stage_source(ctx_for(group_size=3 * (1 + 2 * 1)), n_criteria=3,
                                                             evals_per_response=1))
    r = ce_rm_reward(ctx)
    assert (r.K, r.E) == (3, 1)  # set once, in stages.rollout_kwargs


def test_the_stages_are_registered():
    from credo.families.judges.config import CERMRolloutSettings
    from credo.family import builtin_families

    fams = builtin_families()
    got = resolve("rollout", "ce_rm_two_stage", "stages.rollout", fams)
    assert got.factory is two_stage_source and got.settings is CERMRolloutSettings and got.family.name == "judges"
    assert resolve("reward", "ce_rm", "stages.reward", fams).factory is ce_rm_reward


def test_three_evaluations_per_response_keep_their_order():
    rows = ce_rm_layout([0], K=1, E=3)
    # chosen 9, 5, 1 vs rejected 8, 4, 0: 9 beats all 3, 5 beats 2, 1 beats 1; rejected 8 is below 9 only (1/3),
    # 4 below 9 and 5 (2/3), 0 below all (1); pairs won 6 of 9
    texts = ["c"] + [box(s) for s in (9, 5, 1, 8, 4, 0)]
    batch = batch_of(rows, texts)
    CERMReward(CharTok(), K=1, E=3)(batch)
    assert batch.rewards.tolist() == pytest.approx([6 / 9, 1.0, 2 / 3, 1 / 3, 1 / 3, 2 / 3, 1.0])


def test_an_empty_shard_has_long_group_ids_and_zero_metrics():
    ids = ce_rm_group_ids([])
    assert ids.dtype == torch.long and ids.numel() == 0
    batch = batch_of([], [])
    CERMReward(CharTok(), K=2, E=1)(batch)
    assert batch.metrics["reward/unparseable_frac"] == 0.0 and batch.metrics["reward/criteria_accuracy"] == 0.0
