"""Built-in tasks: disjoint splits, verifiers, and the reasoning-gym adapter on a real dataset."""

import pytest

from credo.config import ConfigError, TaskConfig
from credo.tasks import ArithmeticTask, make_task


def test_arithmetic_splits_are_disjoint_and_verifier_exact():
    t = ArithmeticTask(train_size=10_000, eval_size=50, seed=3, max_operand=20, ops="+-")
    train = {t.train(i).prompt for i in range(len(t))}
    evals = [p.prompt for p in t.eval_problems()]
    assert len(evals) == 50 and not train & set(evals)
    p = t.train(0)
    a, b = (int(x) for x in p.prompt[:-1].replace("-", "+").split("+"))
    expected = a + b if "+" in p.prompt else a - b
    assert t.score(str(expected), p) == 1.0
    assert t.score(f" {expected}\n", p) == 1.0  # surrounding whitespace is not an error
    assert t.score(str(expected + 1), p) == 0.0


def test_fixed_width_format():
    t = ArithmeticTask(train_size=100, eval_size=5, seed=0, max_operand=49, fixed_width=True)
    for i in range(20):
        p = t.train(i)
        a, b = int(p.prompt[:2]), int(p.prompt[3:5])
        assert len(p.prompt) == 6 and p.answer == f"{a + b:03d}"


def test_arithmetic_rejects_bad_kwargs():
    with pytest.raises(ConfigError, match="task.kwargs.ops"):
        make_task(TaskConfig(kwargs={"ops": "*"}))
    with pytest.raises(ConfigError, match="task.kwargs for 'arithmetic'"):
        make_task(TaskConfig(kwargs={"max_operandd": 5}))
    with pytest.raises(ConfigError, match="task.name"):
        make_task(TaskConfig(name="arithmetik"))


def test_reasoning_gym_adapter_on_real_dataset():
    pytest.importorskip("reasoning_gym")
    t = make_task(TaskConfig(name="rg:chain_sum", train_size=30, eval_size=10, seed=1,
                             kwargs={"min_terms": 2, "max_terms": 2, "max_digits": 1}))
    p = t.train(0)
    assert p.prompt.endswith("Answer: ")
    assert t.score(p.answer, p) == 1.0
    assert t.score("not a number", p) == 0.0
    train_q = {t.train(i).prompt for i in range(len(t))}
    assert all(e.prompt not in train_q for e in t.eval_problems())
    with pytest.raises(ConfigError, match="rejected by reasoning-gym"):
        make_task(TaskConfig(name="rg:chain_sum", kwargs={"min_termz": 2}))
