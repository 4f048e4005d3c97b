"""RewardWorker: failures and timeouts masked and counted, each kind logged once, contract errors named."""

from __future__ import annotations

import logging
import math
import threading
import time

import pytest

from credo.config import ConfigError
from credo.rewards.tasks import Problem
from credo.rewards.worker import RewardFunctionError, RewardWorker, import_reward_fn


def groups_of(prompts: list[str], size: int = 2) -> list[tuple[list, list]]:
    """One group per prompt: `size` responses 'r0', 'r1', ... and the prompt repeated as the problem."""
    return [([f"r{j}" for j in range(size)], [p] * size) for p in prompts]


def score_by_prompt(responses, problems):
    """Raise for prompts 'raise*', sleep past any short timeout for 'sleep*', else reward = response index."""
    if problems[0].startswith("raise"):
        raise KeyError(problems[0])
    if problems[0].startswith("sleep"):
        time.sleep(1.0)
    return [float(r[1:]) for r in responses]


def worker(fn=score_by_prompt, **kw) -> RewardWorker:
    kw = {"timeout_s": 0.2, "workers": 4, "max_failure_frac": 0.75, **kw}
    return RewardWorker(fn, **kw)


def test_failed_and_timed_out_calls_mask_their_samples():
    res = worker()(groups_of(["ok", "raise", "sleep", "ok2"]), step=3)
    # group by group: ok -> [0, 1]; raise -> masked; sleep -> masked; ok2 -> [0, 1]
    assert res.rewards == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert res.valid == [True, True, False, False, False, False, True, True]
    assert (res.failures, res.timeouts) == (2, 2)  # samples: both of 'raise' fail again one by one


def test_timeout_does_not_wait_for_the_call():
    t0 = time.perf_counter()
    res = worker(max_failure_frac=1.0)(groups_of(["sleep", "sleep2"]), step=1)
    assert time.perf_counter() - t0 < 0.9  # each call sleeps 1.0 s; the worker gives up after 0.2 s
    assert res.timeouts == 4 and not any(res.valid)  # 2 groups of 2 samples; a timed-out group is not retried


def test_each_failure_kind_logged_once(caplog):
    w = worker()
    with caplog.at_level(logging.WARNING, logger="credo.rewards"):
        for step in range(3):
            w(groups_of(["raise", "raise2", "sleep", "ok"]), step=step)
    logged = [r for r in caplog.records if "failed at step" in r.getMessage()]
    assert len(logged) == 2, [r.getMessage() for r in logged]  # one KeyError, one timeout, over 9 failed calls
    key_error = next(r for r in logged if "KeyError" in r.getMessage())
    assert "step 0" in key_error.getMessage() and key_error.exc_info is not None  # the first one, with traceback
    assert any("reward.timeout_s=0.2" in r.getMessage() for r in logged)


def test_failure_fraction_above_cap_stops():
    w = worker(max_failure_frac=0.5)
    w(groups_of(["raise", "ok"]), step=1)  # exactly 0.5 of the samples: allowed
    with pytest.raises(RewardFunctionError, match=r"4 of 6 samples failed their reward call at step 2, above "
                                                  r"reward.max_failure_frac=0.5; the reward function 'score_by_prompt'"):
        w(groups_of(["raise", "sleep", "ok"]), step=2)


def test_wrong_length_names_function_and_lengths():
    def wrong_length(responses, problems):
        return [1.0] * (len(responses) + 1)

    with pytest.raises(RewardFunctionError, match="reward function .*wrong_length' returned 4 rewards for 3 responses"):
        worker(wrong_length)(groups_of(["a"], size=3), step=1)


@pytest.mark.parametrize("value, expected", [
    ("high", r"returned 'high' \(str\) at index 0; expected a number"),
    (None, r"returned None \(NoneType\) at index 0; expected a number"),
    (True, r"returned True \(bool\) at index 0; expected a number"),
    (float("nan"), r"returned non-finite nan at index 0"),
])
def test_non_number_names_function_index_and_type(value, expected):
    def bad(responses, problems):
        return [value] + [1.0] * (len(responses) - 1)

    with pytest.raises(RewardFunctionError, match=expected):
        worker(bad)(groups_of(["a"]), step=1)


def test_not_a_list_is_named():
    with pytest.raises(RewardFunctionError, match=r"returned float; expected a list of 2 numbers"):
        worker(lambda responses, problems: 1.0)(groups_of(["a"]), step=1)


def test_numpy_and_int_rewards_are_numbers():
    np = pytest.importorskip("numpy")
    res = worker(lambda responses, problems: [np.float32(0.5), 1])(groups_of(["a"]), step=1)
    assert res.rewards == [0.5, 1.0] and res.valid == [True, True]


def test_calls_run_concurrently():
    """Calls of one step overlap (workers > 1): an LLM judge does not serialise the step."""
    inside, peak, lock = [0], [0], threading.Lock()

    def judge(responses, problems):
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return [0.0] * len(responses)

    worker(judge, timeout_s=5.0)(groups_of(["a", "b", "c", "d"]), step=1)
    assert peak[0] > 1


@pytest.mark.parametrize("spec, expected", [
    ("tests.e2e.rewards", "expected 'module:function'"),
    ("tests.e2e.nope:f", "cannot be imported"),
    ("tests.e2e.rewards:nope", "cannot be imported"),
    ("tests.e2e.rewards:FLAGGED", "is not callable"),
])
def test_reward_function_spec_errors(spec, expected):
    with pytest.raises(ConfigError, match=f"reward.function = '{spec}'.*{expected}"):
        import_reward_fn(spec)


def reward_threads(w) -> int:
    return sum(t.name == w.thread_name for t in threading.enumerate())


def test_hung_calls_cost_no_capacity_and_threads_stay_bounded():
    """Two workers, both stuck in calls that time out: the next step still runs at full speed, and
    once the stuck calls return their threads leave, back to the configured two."""
    w = worker(workers=2, max_failure_frac=1.0)
    res = w(groups_of(["sleep", "sleep2"]), step=1)  # each sleeps 1.0 s, timeout 0.2 s
    assert res.timeouts == 4
    t0 = time.perf_counter()
    res = w(groups_of(["ok", "ok2", "ok3"]), step=2)
    assert time.perf_counter() - t0 < 0.5 and all(res.valid)  # replacements took the calls at once
    assert reward_threads(w) == 4  # two replacements, two still inside their sleep
    deadline = time.monotonic() + 3.0
    while reward_threads(w) > 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reward_threads(w) == 2
    w.close()
    deadline = time.monotonic() + 3.0
    while reward_threads(w) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reward_threads(w) == 0


def test_late_result_of_a_timed_out_call_is_not_used():
    w = worker(workers=1, max_failure_frac=1.0)
    res = w(groups_of(["sleep"]), step=1)
    assert res.timeouts == 2 and res.rewards == [0.0, 0.0] and res.valid == [False, False]
    time.sleep(1.0)  # the call has returned [0, 1] by now, too late
    res = w(groups_of(["ok"]), step=2)
    assert res.rewards == [0.0, 1.0] and res.valid == [True, True] and res.timeouts == 0


def parse_reward(completions, **kwargs):
    """A TRL-style function that breaks on bad input: one unparseable completion raises for its whole list."""
    return [float(int(c)) / 10 for c in completions]


def test_one_failing_sample_fails_alone_not_its_group():
    """10% of the samples raise (TRL's list-in, list-out contract; the group call raises for all of them):
    exactly those are masked and counted, every other sample of their groups keeps its score."""
    from credo.rewards.functions import WeightedRewards

    responses = [str(i) if i % 10 != 3 else "three" for i in range(40)]  # samples 3, 13, 23, 33 cannot parse
    problems = [Problem(prompt=f"p{i // 8}", answer="") for i in range(40)]
    groups = [(responses[i:i + 8], problems[i:i + 8], [[0]] * 8) for i in range(0, 40, 8)]
    w = worker(WeightedRewards([parse_reward, length_reward]), max_failure_frac=0.2, timeout_s=5.0)
    res = w(groups, step=1)
    bad = [i for i, r in enumerate(responses) if not r.isdigit()]
    assert [i for i, ok in enumerate(res.valid) if not ok] == bad
    assert (res.failures, res.timeouts) == (4, 0)  # samples, not the 4 groups that raised
    for i, r in enumerate(responses):
        if i in bad:
            assert res.rewards[i] == 0.0 and math.isnan(res.parts["parse_reward"][i])
            assert math.isnan(res.parts["length_reward"][i])
        else:
            assert res.rewards[i] == pytest.approx(int(r) / 10 + len(r))
            assert res.parts["parse_reward"][i] == pytest.approx(int(r) / 10)
            assert res.parts["length_reward"][i] == len(r)
    w.close()


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]
