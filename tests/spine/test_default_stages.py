"""The built-in stages one by one, in this process: the prompt rollout source, the evaluator, the function reward,
the outcome advantage and the rollout dump. Their collaborators (rollout backend, reward worker, tokenizer,
estimator) are small recording objects handed in as arguments; every expected value is derived by hand."""

from __future__ import annotations

import hashlib
import json
import math
import struct

import pytest
import torch

from credo.distributed.rollout import Sample
from credo.tasks import Problem
from credo.rewards.worker import RewardResult
from credo.train.batch import Batch
from tests.fakes import CharTok

SPECIAL = 0  # the one special token of the char tokenizer below, decoded as "<s>"


class Task:
    def __init__(self, problems, eval_problems=(), score=None):
        self.problems, self._eval = list(problems), list(eval_problems)
        if score is not None:
            self.score = score

    def __len__(self):
        return len(self.problems)

    def train(self, i):
        return self.problems[i]

    def eval_problems(self):
        return list(self._eval)


class Backend:
    """Answers each prompt with the response ids `answer(prompt_ids)`; records every call."""

    def __init__(self, answer=lambda p: [ord("x")]):
        self.answer, self.calls, self.synced, self.closed = answer, [], [], 0

    def generate(self, prompts, **kw):
        self.calls.append(dict(prompts=[list(p) for p in prompts], **kw))
        out = []
        for p in prompts:
            r = self.answer(list(p))
            out.append(Sample(list(p), r, [1] * len(r), [-0.5] * len(r), True))
        return out

    def sync_weights(self, model, version):
        self.synced.append((model, version))

    def close(self):
        self.closed += 1


def naive_step_seed(seed, step, salt):
    digest = hashlib.sha256(("%d:%d:%d" % (seed, step, salt)).encode("ascii")).digest()
    return struct.unpack("<I", digest[:4])[0] % 2 ** 31


def problems(n, prefix="p"):
    return [Problem(prompt=f"{prefix}{i}", answer=str(i)) for i in range(n)]


# ------------------------------------------------------------------------------------------------ rollout
def test_step_seed_is_the_low_31_bits_of_the_sha256_of_seed_step_salt():
    from credo.train.rollout import step_seed

    for seed, step, salt in [(0, 0, 0), (7, 3, 1), (123, -1, 45), (2 ** 40, 99, 7)]:
        assert step_seed(seed, step, salt) == naive_step_seed(seed, step, salt)
    assert max(step_seed(s, 0, 0) for s in range(200)) < 2 ** 31
    assert max(step_seed(s, 0, 0) for s in range(200)) >= 2 ** 30  # the top bit kept: 31 bits, not fewer


def test_step_problem_indices_are_a_pure_function_of_seed_and_step_inside_the_range():
    from credo.train.rollout import step_problem_indices

    a = step_problem_indices(3, 5, 7, 50)
    assert a == step_problem_indices(3, 5, 7, 50) and len(a) == 50 and set(a) <= set(range(7))
    assert set(a) == set(range(7))  # 50 draws from 7 reach every problem, the last one included
    assert a != step_problem_indices(3, 6, 7, 50) and a != step_problem_indices(4, 5, 7, 50)
    # the generator is seeded with step_seed(seed, step, 0)
    gen = torch.Generator().manual_seed(naive_step_seed(3, 5, 0))
    assert a == [int(x) for x in torch.randint(0, 7, (50,), generator=gen)]


@pytest.mark.parametrize("holdout", [-1, 3, 4])
def test_prompt_rollout_rejects_a_holdout_outside_the_training_problems(holdout):
    from credo.train.rollout import PromptRollout

    with pytest.raises(ValueError, match=rf"^holdout is {holdout}, expected 0 <= holdout < 3 \(the training problems\)$"):
        PromptRollout(Task(problems(3)), CharTok(), Backend(), seed=0, prompts_per_step=2, group_size=2,
                      max_new_tokens=4, temperature=1.0, top_p=1.0, holdout=holdout)


def _source(world=1, rank=0, holdout=0, n=6, backend=None, **kw):
    from credo.train.rollout import PromptRollout

    settings = dict(seed=11, prompts_per_step=4, group_size=3, max_new_tokens=5, temperature=0.7, top_p=0.9)
    settings.update(kw)
    return PromptRollout(Task(problems(n)), CharTok(), backend or Backend(), rank=rank, world=world, holdout=holdout,
                         **settings)


def test_prompt_rollout_samples_group_size_responses_per_prompt_with_the_step_seeds():
    from credo.train.rollout import step_problem_indices

    src = _source()
    batch = src.rollout(4)
    idx = step_problem_indices(11, 4, 6, 4)
    call, = src.backend.calls
    want_prompts = [[ord(c) for c in f"p{i}"] for i in idx for _ in range(3)]  # plain prompt, repeated G times
    assert call["prompts"] == want_prompts
    assert (call["max_new_tokens"], call["temperature"], call["top_p"]) == (5, 0.7, 0.9)
    assert call["seeds"] == [naive_step_seed(11, 4, 1 + i * 3 + g) for i in range(4) for g in range(3)]
    assert ("encode", False) in src.tokenizer.calls  # no special tokens added to the rendered prompt
    assert batch.step == 4 and len(batch) == 12
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [p.prompt for p in batch.problems] == [f"p{i}" for i in idx for _ in range(3)]
    assert [s.prompt_ids for s in batch.samples] == want_prompts


def test_each_rank_takes_its_share_of_the_steps_prompts():
    from credo.train.rollout import step_problem_indices

    idx = step_problem_indices(11, 2, 6, 4)
    one = _source().rollout(2)
    shares = [_source(world=2, rank=r).rollout(2) for r in (0, 1)]
    assert shares[0].group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert shares[1].group_ids.tolist() == [2, 2, 2, 3, 3, 3]
    assert [p.prompt for p in shares[1].problems] == [f"p{i}" for i in idx[2:] for _ in range(3)]
    seeds = [_source(world=2, rank=r) for r in (0, 1)]
    for s in seeds:
        s.rollout(2)
    # the seed of a sample depends on its global prompt index, not on the rank: together the ranks draw
    # exactly what one process draws
    assert seeds[0].backend.calls[0]["seeds"] + seeds[1].backend.calls[0]["seeds"] == \
        [naive_step_seed(11, 2, 1 + i * 3 + g) for i in range(4) for g in range(3)]
    assert [s.prompt_ids for b in shares for s in b.samples] == [s.prompt_ids for s in one.samples]


def test_holdout_keeps_the_last_training_problems_out_of_every_draw():
    src = _source(holdout=2, n=4, prompts_per_step=8, group_size=1)
    drawn = {p.prompt for step in range(10) for p in src.rollout(step).problems}
    assert drawn == {"p0", "p1"}


def test_prompt_rollout_generate_sync_state_and_close_reach_the_backend():
    src = _source()
    out = src.generate([[1, 2], [3]], temperature=0.25, seeds=[5, 6])
    assert [s.prompt_ids for s in out] == [[1, 2], [3]]
    assert src.backend.calls[-1] == dict(prompts=[[1, 2], [3]], max_new_tokens=5, temperature=0.25, top_p=1.0,
                                         seeds=[5, 6])
    src.generate([[1]], temperature=1.0, seeds=None)
    assert src.backend.calls[-1]["seeds"] is None
    model = torch.nn.Linear(1, 1)
    src.sync(model, 7)
    assert src.backend.synced == [(model, 7)]
    assert src.state_dict() == {}
    assert src.load_state_dict({"anything": 1}) is None
    assert src.backend.closed == 0
    src.close()
    assert src.backend.closed == 1


def test_prompt_rollout_renders_prompts_with_its_render():
    src = _source(render=lambda p: "<" + p.prompt + ">")
    batch = src.rollout(0)
    assert all(bytes(s.prompt_ids).decode().startswith("<p") and s.prompt_ids[-1] == ord(">") for s in batch.samples)


# ------------------------------------------------------------------------------------------------ evaluate
class Source:
    """An eval source: answers each prompt with `answer(prompt_ids)` and records every generate call."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def generate(self, prompts, *, temperature, seeds):
        self.calls.append(dict(prompts=[list(p) for p in prompts], temperature=temperature, seeds=seeds))
        return [Sample(list(p), self.answer(list(p)), [1], [0.0], True) for p in prompts]


def _evaluator(task, source, **kw):
    from credo.train.evaluate import Evaluator

    settings = dict(seed=5, temperature=0.0, samples=1)
    settings.update(kw)
    return Evaluator(task, CharTok(), source, **settings)


def _verifier(text, problem):
    if text == "boom":
        raise RuntimeError("verifier crash")
    return 1.0 if text == problem.answer else 0.0


def _echo_digit(prompt):  # answers "q<i>" with "<i>" (the right answer), and "q3" with a crash of the verifier
    text = bytes(prompt).decode()
    return [ord(c) for c in ("boom" if text == "q3" else text[1:])] + [SPECIAL]


def test_greedy_evaluation_is_the_fraction_of_correct_answers_a_crash_scores_0():
    probs = problems(5, prefix="q")
    probs[1] = Problem("q1", "wrong")
    src = Source(_echo_digit)
    ev = _evaluator(Task([], probs, score=_verifier), src)
    assert ev.metric == "eval/accuracy"
    assert ev() == pytest.approx(3 / 5)  # q0, q2, q4 right; q1 wrong; q3 crashes the verifier
    call, = src.calls
    assert call["seeds"] is None and call["temperature"] == 1.0  # greedy: no seeds
    assert call["prompts"] == [[ord(c) for c in f"q{i}"] for i in range(5)]
    assert ("decode", True) in ev.tokenizer.calls  # special tokens are not part of the scored text


def test_sampled_evaluation_draws_samples_per_problem_with_fixed_seeds():
    probs = problems(3, prefix="q")
    src = Source(_echo_digit)
    ev = _evaluator(Task([], probs, score=_verifier), src, temperature=0.6, samples=2)
    assert ev() == 1.0
    call, = src.calls
    assert call["temperature"] == 0.6
    assert call["prompts"] == [[ord(c) for c in f"q{i}"] for i in range(3) for _ in range(2)]
    assert call["seeds"] == [naive_step_seed(5, -1, j * 2 + s) for j in range(3) for s in range(2)]


def test_evaluation_deals_problems_round_robin_to_ranks(monkeypatch):
    import credo.train.evaluate as evaluate

    reduced = []
    monkeypatch.setattr(evaluate, "all_reduce_sum", lambda t: reduced.append(t.clone()) or t)
    probs = problems(5, prefix="q")
    src = Source(_echo_digit)
    ev = _evaluator(Task([], probs, score=_verifier), src, temperature=0.5, samples=2, rank=1, world=2)
    ev()
    call, = src.calls
    assert call["prompts"] == [[ord(c) for c in f"q{j}"] for j in (1, 3) for _ in range(2)]
    assert call["seeds"] == [naive_step_seed(5, -1, j * 2 + s) for j in (1, 3) for s in range(2)]
    # this rank's correct answers and its number of samples are what is summed over ranks, in float64
    (t,) = reduced
    assert t.dtype == torch.float64 and t.tolist() == [2.0, 4.0]  # q1 right twice; q3 crashes twice


def test_a_task_with_a_verifier_ignores_the_reward_functions():
    ev = _evaluator(Task([], problems(1), score=_verifier), Source(_echo_digit), reward_fn=lambda *a: 1 / 0)
    assert ev.reward_fn is None and ev.metric == "eval/accuracy"


class Scored:
    def __init__(self, values):
        self.values = values

    def finish(self, n):
        assert n == 1
        return self.values


def test_without_a_verifier_the_score_is_the_mean_weighted_reward_a_failed_call_scores_0():
    calls = []

    def reward_fn(texts, probs, ids):
        calls.append((texts, [p.prompt for p in probs], ids))
        if texts == ["boom"]:
            raise RuntimeError("judge down")
        return Scored([float(len(texts[0]))])

    src = Source(_echo_digit)
    probs = [Problem(f"q{i}", "") for i in (12, 3, 4)]
    ev = _evaluator(Task([], probs), src, reward_fn=reward_fn)
    assert ev.metric == "eval/reward_mean" and ev.reward_fn is reward_fn
    assert ev() == pytest.approx((2 + 0 + 1) / 3)  # "12" scores 2, "boom" fails (0), "4" scores 1
    assert calls[0] == (["12"], ["q12"], [[ord("1"), ord("2"), SPECIAL]])  # one sample per call, with its ids
    assert [c[0] for c in calls] == [["12"], ["boom"], ["4"]]


# ------------------------------------------------------------------------------------------------ reward
class Worker:
    """A reward worker that returns a fixed result and records what it was asked."""

    def __init__(self, result, takes_ids=False):
        self.result, self.calls, self.closed = result, [], 0
        self.fn = type("Fn", (), {"takes_completion_ids": True})() if takes_ids else (lambda r, p: None)

    def __call__(self, groups, *, step):
        self.calls.append((groups, step))
        return self.result

    def close(self):
        self.closed += 1


def _reward_batch(n=4, step=3):
    samples = [Sample([1], [ord("a") + i, SPECIAL], [1, 1], [0.0, 0.0], True) for i in range(n)]
    return Batch(samples=samples, problems=problems(n), group_ids=torch.arange(n) // 2, step=step)


def test_function_reward_scores_groups_of_decoded_responses():
    from credo.train.reward import FunctionReward

    worker = Worker(RewardResult([1.0, 0.5, 0.0, 2.0], [True, True, False, True], failures=1, timeouts=2))
    tok = CharTok()
    batch = _reward_batch()
    FunctionReward(worker, tok, group_size=2)(batch)
    (groups, step), = worker.calls
    assert step == 3
    assert [(texts, [p.prompt for p in ps]) for texts, ps in groups] == [(["a", "b"], ["p0", "p1"]),
                                                                        (["c", "d"], ["p2", "p3"])]
    assert tok.calls == [("decode", True)]
    assert batch.rewards.tolist() == [1.0, 0.5, 0.0, 2.0] and batch.valid.tolist() == [True, True, False, True]
    assert batch.valid.dtype == torch.bool
    assert batch.metrics == {"reward/failures": 3, "reward/timeouts": 2}  # failures count the timeouts too


def test_function_reward_passes_the_response_ids_to_functions_that_take_them_and_logs_each_mean():
    from credo.train.reward import FunctionReward

    parts = {"f": [1.0, math.nan, 3.0, 5.0], "g": [math.nan] * 4}
    worker = Worker(RewardResult([0.0] * 4, [True] * 4, 0, 0, parts), takes_ids=True)
    batch = _reward_batch(step=9)
    FunctionReward(worker, CharTok(), group_size=4)(batch)
    (groups, step), = worker.calls
    assert step == 9 and len(groups) == 1
    texts, ps, ids = groups[0]
    assert texts == ["a", "b", "c", "d"] and ids == [[ord(c), SPECIAL] for c in "abcd"]
    assert batch.metrics["train/rewards/f"] == pytest.approx(3.0)  # NaN (skipped or failed) is left out
    assert math.isnan(batch.metrics["train/rewards/g"])  # no sample scored
    assert batch.metrics["reward/failures"] == 0 and batch.metrics["reward/timeouts"] == 0


def test_function_reward_means_are_summed_over_ranks(monkeypatch):
    import credo.train.reward as reward

    # two identical ranks: sums and counts double, the means stay
    monkeypatch.setattr(reward, "all_reduce_sum", lambda t: t * 2)
    worker = Worker(RewardResult([0.0] * 2, [True] * 2, 0, 0, {"f": [1.0, 2.0]}))
    batch = _reward_batch(n=2)
    reward.FunctionReward(worker, CharTok(), group_size=2)(batch)
    assert batch.metrics["train/rewards/f"] == pytest.approx(1.5)


def test_function_reward_means_are_taken_in_float64():
    from credo.train.reward import FunctionReward

    # 100000001 has no float32 value (float32 keeps 24 bits): a float32 mean would read 50000000.0
    worker = Worker(RewardResult([0.0] * 2, [True] * 2, 0, 0, {"big": [100000001.0, 0.0]}))
    batch = _reward_batch(n=2)
    FunctionReward(worker, CharTok(), group_size=2)(batch)
    assert batch.metrics["train/rewards/big"] == 50000000.5


def test_function_reward_close_closes_its_worker():
    from credo.train.reward import FunctionReward

    worker = Worker(None)
    FunctionReward(worker, CharTok(), 2).close()
    assert worker.closed == 1


# ------------------------------------------------------------------------------------------------ advantage
def _adv_batch(rewards, valid, groups, lengths, T=None, loss_rows=None):
    T = T or max(lengths) + 1
    B = len(rewards)
    resp = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        resp[i, 1:1 + n] = True
    batch = Batch(samples=[None] * B, problems=[None] * B, group_ids=torch.tensor(groups), step=1)
    batch.rewards, batch.valid = torch.tensor(rewards), torch.tensor(valid)
    batch.response_mask = resp
    batch.loss_mask = resp.clone()
    for i in (loss_rows or ()):
        batch.loss_mask[i] = False
    return batch


def test_outcome_advantage_runs_the_estimator_on_the_valid_samples_only():
    from credo.train.advantage import OutcomeAdvantage

    seen = []

    def estimator(rewards, group_ids, mask, *, scale):
        seen.append((rewards.tolist(), group_ids.tolist(), mask.clone()))
        return (rewards * scale)[:, None].expand_as(mask) * mask

    kwargs = {"scale": 2.0}
    stage = OutcomeAdvantage(estimator, kwargs)
    kwargs["scale"] = 100.0  # the stage keeps its own copy of the settings
    batch = _adv_batch([1.0, 3.0, 5.0, 7.0], [True, False, True, True], [0, 0, 1, 1], [2, 1, 3, 1], loss_rows=[3])
    stage(batch)
    (rewards, gids, mask), = seen
    assert rewards == [1.0, 5.0, 7.0] and gids == [0, 1, 1]
    assert mask.tolist() == batch.response_mask[[0, 2, 3]].tolist()
    want = torch.zeros(4, 4)
    want[0, 1:3] = 2.0
    want[2, 1:4] = 10.0  # row 1 invalid: 0; row 3 overlong-filtered (no loss tokens): 0
    assert torch.equal(batch.advantages, want)
    assert stage.state_dict() == {} and stage.load_state_dict({"x": 1}) is None


def test_outcome_advantage_without_a_valid_reward_is_zero_and_keeps_the_reward_dtype():
    from credo.train.advantage import OutcomeAdvantage

    batch = _adv_batch([1.0, 2.0], [False, False], [0, 0], [1, 2])
    batch.rewards = batch.rewards.double()
    OutcomeAdvantage(lambda *a: 1 / 0, {})(batch)
    assert batch.advantages.dtype == torch.float64 and not batch.advantages.any()
    assert batch.advantages.shape == (2, 3)


def test_outcome_advantage_over_two_ranks_keeps_this_ranks_rows(monkeypatch):
    import credo.train.advantage as advantage

    # rank 1 of 2: its 2 rows are gathered after rank 0's 2 rows (whose responses are longer: width 5)
    other = _adv_batch([10.0, 20.0], [True, True], [0, 0], [4, 3])  # T = 5
    mine = _adv_batch([30.0, 40.0], [True, True], [1, 1], [1, 2])  # T = 3
    monkeypatch.setattr(advantage, "rank_and_world", lambda: (1, 2))
    monkeypatch.setattr(advantage, "all_reduce_max", lambda t: torch.maximum(t, torch.tensor(5)))

    def gather(t):
        theirs = {id(mine.rewards): other.rewards, id(mine.valid): other.valid, id(mine.group_ids): other.group_ids}
        if id(t) in theirs:
            return torch.cat([theirs[id(t)], t])
        return torch.cat([torch.nn.functional.pad(other.response_mask, (0, t.shape[1] - 5)), t])

    monkeypatch.setattr(advantage, "all_gather_cat", gather)
    seen = []

    def estimator(rewards, group_ids, mask):
        seen.append((rewards.tolist(), group_ids.tolist(), mask.shape))
        return rewards[:, None] + torch.arange(mask.shape[1])[None, :]

    advantage.OutcomeAdvantage(estimator, {})(mine)
    assert seen == [([10.0, 20.0, 30.0, 40.0], [0, 0, 1, 1], (4, 5))]
    want = torch.tensor([[30.0, 31, 32], [40, 41, 42]]) * mine.loss_mask
    assert torch.equal(mine.advantages, want)


def test_gather_rows_right_pads_to_the_width():
    from credo.train.advantage import gather_rows

    x = torch.tensor([[1, 2], [3, 4]])
    assert gather_rows(x, 4).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert gather_rows(x, 2).tolist() == [[1, 2], [3, 4]]


# ------------------------------------------------------------------------------------------------ dump
class Meta:
    def __str__(self):
        return "meta-object"


def _dump_batch(step=6):
    samples = [Sample([ord("h"), ord("i")], [ord("a"), ord("b"), SPECIAL], [1, 1, 0], [-0.5, -1.5, 0.0], True,
                      policy_version=5, meta={"turn": 1, "obj": Meta()}),
               Sample([ord("q")], [ord("z")], [1], [-0.25], False, policy_version=4, meta={"stream_index": 17},
                      policy_versions=[4])]
    batch = Batch(samples=samples, problems=[Problem("hi", "42"), "no-answer"], group_ids=torch.tensor([3, 8]),
                  step=step)
    batch.rewards, batch.valid = torch.tensor([0.75, 0.0]), torch.tensor([True, False])
    T = 4  # prompt + response - 1 of the longest sample
    batch.loss_mask = torch.tensor([[False, True, True, False], [False] * 4])
    batch.advantages = torch.tensor([[9.0, 0.1234567, -2.0, 3.0], [0.5, 7.0, 8.0, 9.0]])
    assert batch.advantages.shape[1] == T
    return batch


def test_dump_writes_one_row_per_sample_with_every_field(tmp_path):
    from credo.train.dump import dump_rollouts

    out = tmp_path / "a" / "rollouts"
    tok = CharTok()
    path = dump_rollouts(_dump_batch(), tok, out)
    assert path == out / "step_6.jsonl" and sorted(p.name for p in out.iterdir()) == ["step_6.jsonl"]
    assert tok.calls == [("decode", False), ("decode", False)]  # special tokens are shown
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {
        "step": 6, "index": 0, "group_id": 3, "prompt": "hi", "response": "ab<s>",
        "prompt_ids": [104, 105], "response_ids": [97, 98, 0], "response_mask": [1, 1, 0],
        "reward": 0.75, "reward_valid": True, "finished": True, "trained": True,
        "advantages": [0.123457, -2.0, 3.0],  # columns p-1 .. p-2+n: the response's tokens, rounded to 6 places
        "rollout_log_probs": [-0.5, -1.5, 0.0], "policy_version": 5, "policy_versions": None, "stream_index": None,
        "answer": "42", "meta": {"turn": 1, "obj": "meta-object"},
    }
    assert rows[1] == {
        "step": 6, "index": 1, "group_id": 8, "prompt": "q", "response": "z",
        "prompt_ids": [113], "response_ids": [122], "response_mask": [1],
        "reward": 0.0, "reward_valid": False, "finished": False, "trained": False,
        "advantages": [0.5], "rollout_log_probs": [-0.25], "policy_version": 4, "policy_versions": [4],
        "stream_index": 17, "answer": None, "meta": {"stream_index": 17},  # partial rollout's fields, overlap's index
    }


def test_dump_of_other_ranks_goes_to_their_own_file_and_advantages_may_be_missing(tmp_path):
    from credo.train.dump import dump_rollouts

    batch = _dump_batch(step=2)
    batch.advantages = None
    path = dump_rollouts(batch, CharTok(), tmp_path, rank=3)
    assert path == tmp_path / "step_2.rank3.jsonl"
    assert [json.loads(line)["advantages"] for line in path.read_text().splitlines()] == [None, None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2.rank3.jsonl"]  # no .tmp left
