"""The long-tail workload task (credo.tasks.longtail): worked answers, verifier, split, length distribution."""

import math
import statistics

import pytest

from credo.config import ConfigError, TaskConfig
from credo.tasks import make_task
from credo.tasks.longtail import LongTailAddTask, worked_sum


def _column_sum(answer: str) -> int:
    """The sum a worked answer claims, rebuilt from its columns (digits written least significant first)."""
    cols, _, total = answer.partition(">")
    digits = [int(c.split("=")[1]) % 10 for c in cols.split(",")]
    carry = int(cols.split(",")[-1].split("=")[1]) // 10
    return int("".join(map(str, [carry] + digits[::-1])))


def test_worked_answer_is_right_and_the_verifier_checks_only_the_result():
    task = LongTailAddTask(500, 50, seed=3)
    for i in range(200):
        p = task.train(i)
        a, b = map(int, p.prompt[:-1].split("+"))
        n = p.meta["digits"]
        assert len(p.prompt) == 2 * n + 2 and _column_sum(p.answer) == a + b == int(p.answer.rpartition(">")[2])
        assert len(p.answer) == 10 * n + 1
        assert task.score(p.answer, p) == 1.0
        assert task.score("scratch>" + str(a + b), p) == 1.0
        assert task.score(p.answer[:-1] + str((a + b + 1) % 10), p) == 0.0
        assert task.score(p.answer.replace(">", "="), p) == 0.0
    assert worked_sum(47, 586, 3) == "7+6+0=13,4+8+1=13,0+5+1=06>0633"


def test_digit_counts_are_lognormal_and_the_lengths_long_tailed():
    task = LongTailAddTask(20000, 10, seed=0, median_digits=3.0, sigma=0.8, max_digits=25)
    digits = [task.train(i).meta["digits"] for i in range(len(task))]
    lengths = sorted(10 * n + 2 for n in digits)  # answer + EOS tokens with the char tokenizer
    assert min(lengths) == 12 and max(lengths) <= 252
    assert statistics.median(digits) == 3
    inner = [math.log(n) for n in digits if 2 <= n <= 10]  # away from the rounding at 1 and the cap
    assert 0.4 < statistics.pstdev(inner) < 0.8
    q99 = lengths[int(0.99 * len(lengths))]
    assert q99 / statistics.median(lengths) > 4 and q99 >= 150


def test_eval_split_is_held_out_and_the_task_is_registered():
    task = make_task(TaskConfig(name="longtail_add", train_size=3000, eval_size=100, seed=1))
    assert isinstance(task, LongTailAddTask)
    held = {p.prompt for p in task.eval_problems()}
    assert len(task.eval_problems()) == 100
    assert not held & {task.train(i).prompt for i in range(len(task))}
    again = make_task(TaskConfig(name="longtail_add", train_size=3000, eval_size=100, seed=1))
    assert [again.train(i).prompt for i in range(50)] == [task.train(i).prompt for i in range(50)]


@pytest.mark.parametrize("kwargs, key", [({"median_digits": 0.5}, "median_digits"), ({"sigma": -1}, "sigma"),
                                         ({"max_digits": 99}, "max_digits")])
def test_bad_kwargs_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=f"task.kwargs.{key}"):
        LongTailAddTask(10, 5, seed=0, **kwargs)
