"""The testbed's skill tasks: worked answers that check out column by column, final-result verifiers, disjoint splits."""

import functools
import re

import pytest

from credo.config import ConfigError, TaskConfig
from credo.tasks import make_task


@functools.lru_cache(maxsize=None)
def _cached(name, items):
    return make_task(TaskConfig(name=name, kwargs=dict(items), train_size=3000, eval_size=200, seed=3))


def _task(name, **kwargs):
    return _cached(name, tuple(sorted(kwargs.items())))


def _fresh(name, **kwargs):
    return make_task(TaskConfig(name=name, kwargs=kwargs, train_size=3000, eval_size=200, seed=3))


def _columns(answer):
    scratch, _, final = answer.partition(">")
    return scratch.split(","), final


@pytest.mark.parametrize("digits", [2, 3, 4])
def test_add_scratch_answers_are_correct_column_arithmetic(digits):
    t = _task("add_scratch", digits=digits)
    for i in range(300):
        p = t.train(i)
        a, b = (int(x) for x in p.prompt.rstrip("=").split("+"))
        cols, final = _columns(p.answer)
        assert len(cols) == digits and int(final) == a + b and len(final) == digits + 1
        carry = 0
        for k, col in enumerate(cols):  # least significant digit first
            x, y, c, s = map(int, re.fullmatch(r"(\d)\+(\d)\+(\d)=(\d\d)", col).groups())
            assert (x, y, c) == (a // 10 ** k % 10, b // 10 ** k % 10, carry) and s == x + y + c
            carry = s // 10
        assert t.score(p.answer, p) == 1.0


@pytest.mark.parametrize("digits", [2, 3])
def test_mul_scratch_answers_are_correct_column_arithmetic(digits):
    t = _task("mul_scratch", digits=digits)
    for i in range(300):
        p = t.train(i)
        a, b = (int(x) for x in p.prompt.rstrip("=").split("*"))
        assert 2 <= b <= 9
        cols, final = _columns(p.answer)
        assert int(final) == a * b
        carry = 0
        for k, col in enumerate(cols):
            x, y, c, s = map(int, re.fullmatch(r"(\d)\*(\d)\+(\d)=(\d\d)", col).groups())
            assert (x, y, c) == (a // 10 ** k % 10, b, carry) and s == x * y + c
            carry = s // 10


@pytest.mark.parametrize("digits", [2, 3])
def test_sub_scratch_answers_are_correct_column_arithmetic(digits):
    t = _task("sub_scratch", digits=digits)
    for i in range(min(300, len(t))):
        p = t.train(i)
        a, b = (int(x) for x in p.prompt.rstrip("=").split("-"))
        assert a >= b and len(p.prompt) == 2 * digits + 2
        cols, final = _columns(p.answer)
        assert len(cols) == digits and int(final) == a - b and len(final) == digits
        borrow = 0
        for k, col in enumerate(cols):  # least significant digit first; each column writes borrow-out, digit
            x, y, c, out, d = map(int, re.fullmatch(r"(\d)-(\d)-(\d)=(\d)(\d)", col).groups())
            assert (x, y, c) == (a // 10 ** k % 10, b // 10 ** k % 10, borrow)
            assert d - 10 * out == x - y - c and 0 <= d <= 9 and out in (0, 1)
            borrow = out
        assert borrow == 0 and t.score(p.answer, p) == 1.0
        assert p.meta["skills"].get("borrow", 0) == sum(int(col[-2]) for col in cols)


def test_scratch_verifier_checks_only_the_final_result():
    t = _task("add_scratch", digits=3)
    p = t.train(0)
    total = p.meta["result"]
    assert t.score(f"junk scratchpad>{total}", p) == 1.0          # any scratchpad, right result
    assert t.score(f"{p.answer[:-1]}{(int(p.answer[-1]) + 1) % 10}", p) == 0.0  # last digit wrong
    assert t.score(p.answer.replace(">", ","), p) == 0.0          # no result marker
    assert t.score(p.answer + ">", p) == 0.0                      # empty result after the last '>'
    assert t.score(f"{p.answer}>1", p) == (1.0 if total == 1 else 0.0)  # the last '>' counts


def test_sort_answers_and_verifier():
    t = _task("sort", length=16)
    for i in range(200):
        p = t.train(i)
        s = p.prompt[len("sort:"):-1]
        assert len(s) == 16 and p.answer == "".join(sorted(s)) and t.score(p.answer, p) == 1.0
        assert t.score(p.answer[::-1], p) == (1.0 if p.answer == p.answer[::-1] else 0.0)
    assert _task("sort", length=8, alphabet=3).train(0).prompt[5:-1].strip("abc") == ""


@pytest.mark.parametrize("name,kwargs", [("add_scratch", {"digits": 3}), ("mul_scratch", {"digits": 3}), ("sub_scratch", {"digits": 2}),
                                         ("sort", {"length": 16})])
def test_splits_are_disjoint_and_answers_long(name, kwargs):
    t = _task(name, **kwargs)
    train = {t.train(i).prompt for i in range(len(t))}
    held = [p.prompt for p in t.eval_problems()]
    assert len(held) == 200 and not train & set(held)
    assert all(16 <= len(t.train(i).answer) <= 64 for i in range(100))  # 16-64 tokens with the char tokenizer


@pytest.mark.parametrize("name,kwargs,key", [("add_scratch", {"digits": 9}, "digits"), ("mul_scratch", {"digits": 0}, "digits"),
                                             ("sub_scratch", {"digits": 1}, "digits"),
                                             ("sort", {"length": 1}, "length"), ("sort", {"alphabet": 30}, "alphabet")])
def test_bad_kwargs_name_the_key(name, kwargs, key):
    with pytest.raises(ConfigError, match=f"task.kwargs.{key}"):
        _fresh(name, **kwargs)
