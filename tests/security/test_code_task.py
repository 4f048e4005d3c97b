"""The `code` task and its sandboxed reward: the reference answer passes every hidden test, a wrong or defective
one does not, a hostile response fails alone with its reason counted, and FunctionReward logs the reasons as
`reward/sandbox_<reason>`."""

from __future__ import annotations

import pytest
import torch

from credo import sandbox
from credo.errors import ConfigError
from credo.rewards.worker import RewardWorker
from credo.tasks import TASKS
from credo.tasks.code import CodeTask, check, reference, sandbox_reward
from credo.train.batch import Batch, Sample
from credo.train.reward import FunctionReward

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot run here (make install adds it)")


def test_the_task_is_registered():
    assert TASKS["code"] is CodeTask


def test_the_reference_is_computed_from_the_steps_not_the_answer_text():
    assert reference((("mul", 3), ("add", 1)), 4) == 13
    assert reference((("sub", 5), ("mul", 2)), -1) == -12
    assert reference((("div", 4), ("mod", 3)), -9) == (-9 // 4) % 3 == 0


def test_problems_hold_hidden_tests_and_the_splits_are_disjoint():
    task = CodeTask(train_size=10_000, eval_size=50, seed=3)
    train = {task.train(i).prompt for i in range(len(task))}
    held = {p.prompt for p in task.eval_problems()}
    assert len(train) + len(held) == 27 + 27 * 27 and not train & held
    p = task.train(0)
    assert p.prompt.startswith("def f(x):  # ") and p.prompt.endswith("\n    return ")
    assert len(p.meta["inputs"]) == 5 and len(p.meta["expected"]) == 5
    assert p.meta["expected"] == [repr(reference(task._train[0][0], x)) for x in p.meta["inputs"]]


def test_answers_pass_and_defects_fail_in_the_sandbox():
    task = CodeTask(train_size=200, eval_size=10, seed=1, ops="add,sub,mul,div,mod")
    for i in range(2):
        p = task.train(i)
        assert check(p.answer, p) == (1.0, "ok"), p.answer
        assert check(p.answer + ".", p)[0] == 0.0  # the warm-up's stray '.': a float where an int is due
    p = task.train(0)
    assert check("x", p)[0] < 1.0


def test_partial_credit_counts_tests_passed():
    p = CodeTask(train_size=1000, eval_size=1, seed=0).train(0)
    wrong_once = f"({p.answer}) if x != {p.meta['inputs'][0]} else None"  # right on 4 of the 5 hidden inputs
    assert check(wrong_once, p) == (0.8, "ok")
    assert check("1 // 0", p) == (0.0, "ok")  # each test's exception fails that test; the program ran


def test_printed_forgeries_do_not_score():
    p = CodeTask(train_size=100, eval_size=1, seed=0).train(0)
    forged = '0\nprint(\'["1", "2", "3", "4", "5"]\')\nimport os\nos._exit(0)'
    assert check(forged, p) == (0.0, "ok")


def test_hostile_responses_fail_alone_with_their_reason_counted():
    p = CodeTask(train_size=100, eval_size=1, seed=0, timeout_s=0.5).train(0)
    # an endless loop that allocates nothing (a growing list could meet the memory limit before the wall clock)
    responses = [p.answer, "next(_ for _ in iter(int, 1) if _)", "len(bytearray(10 ** 10))",
                 "__import__('os').kill(__import__('os').getpid(), 9)", "1 +", p.answer]
    group = sandbox_reward(responses, [p] * len(responses))
    rewards = group.finish(len(responses))
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert group.parts["reward/sandbox_timeout"] == [0, 1, 0, 0, 0, 0]
    assert group.parts["reward/sandbox_memory"] == [0, 0, 1, 0, 0, 0]
    assert group.parts["reward/sandbox_killed"] == [0, 0, 0, 1, 0, 0]
    assert group.parts["reward/sandbox_error"] == [0, 0, 0, 0, 1, 0]


class _Tok:
    def __init__(self, texts):
        self.texts = texts

    def batch_decode(self, ids, skip_special_tokens=True):
        return [self.texts[i[0]] for i in ids]


def test_function_reward_logs_the_reasons_under_their_own_names():
    p = CodeTask(train_size=100, eval_size=1, seed=0, timeout_s=0.5).train(1)
    texts = [p.answer, p.answer + ".", "next(_ for _ in iter(int, 1) if _)", "1 +"]
    worker = RewardWorker(sandbox_reward, timeout_s=30, workers=2, max_failure_frac=1.0)
    batch = Batch(samples=[Sample(prompt_ids=[9], response_ids=[i], response_mask=[1], rollout_log_probs=[0.0],
                                  finished=True) for i in range(4)],
                  problems=[p] * 4, group_ids=torch.tensor([0, 0, 1, 1]), step=1)
    FunctionReward(worker, _Tok(texts), group_size=2)(batch)
    worker.close()
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 0.0] and batch.valid.all()
    assert batch.metrics["train/rewards/pass_rate"] == pytest.approx(0.25)
    assert batch.metrics["reward/sandbox_timeout"] == pytest.approx(0.25)
    assert batch.metrics["reward/sandbox_error"] == pytest.approx(0.25)
    assert batch.metrics["reward/sandbox_memory"] == 0.0
    assert "train/rewards/reward/sandbox_timeout" not in batch.metrics


@pytest.mark.parametrize("kwargs, match", [({"ops": "add,pow"}, "task.kwargs.ops"),
                                           ({"max_steps": 3}, "task.kwargs.max_steps"),
                                           ({"num_tests": 0}, "task.kwargs.num_tests"),
                                           ({"timeout_s": 0}, "task.kwargs.timeout_s")])
def test_bad_task_kwargs_name_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        CodeTask(train_size=10, eval_size=1, seed=0, **kwargs)
