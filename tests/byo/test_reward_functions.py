"""reward.functions / reward.weights: TRL's calling convention, weighted sums, None, per-function means, config errors."""

from credo.plan import resolve_plan
import math

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.distributed.rollout import Sample
from credo.rewards.functions import WeightedRewards, is_trl_style, trl_kwargs
from credo.tasks import Problem
from credo.rewards.worker import RewardFunctionError, RewardWorker
from credo.train.batch import Batch
from credo.train.reward import FunctionReward


def _problems(n, chat=False):
    return [Problem(prompt=[{"role": "user", "content": f"q{i}"}] if chat else f"q{i}", answer=str(i),
                    meta={"columns": {"answer": str(i), "level": i % 2}}) for i in range(n)]


def test_signature_detection():
    def trl(prompts, completions, **kw): ...

    def group(responses, problems): ...

    assert is_trl_style(trl) and not is_trl_style(group)


def test_trl_keywords_for_text_and_chat_prompts():
    kw = trl_kwargs(["a", "b"], _problems(2), [[1], [2, 3]])
    assert kw["prompts"] == ["q0", "q1"] and kw["completions"] == ["a", "b"]
    assert kw["completion_ids"] == [[1], [2, 3]] and kw["answer"] == ["0", "1"] and kw["level"] == [0, 1]
    chat = trl_kwargs(["a"], _problems(1, chat=True), [[1]])
    assert chat["completions"] == [[{"role": "assistant", "content": "a"}]]
    assert chat["prompts"] == [[{"role": "user", "content": "q0"}]]


def test_weighted_sum_skips_none_and_mixes_both_conventions():
    def trl_fn(completions, level, **kw):
        return [None if lv == 1 else 2.0 for lv in level]

    def named(completions, answer):  # no **kwargs: gets only what it names
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

    def group_fn(responses, problems):
        return [float(len(r)) for r in responses]

    w = WeightedRewards([trl_fn, named, group_fn], [0.5, 2.0, -1.0])
    out = w(["0", "xx", "2"], _problems(3), [[1], [2], [3]])
    total = out.finish(3)
    # by hand: sample 0: 0.5*2 + 2*1 - 1*1 = 2; sample 1: (None) + 2*0 - 1*2 = -2; sample 2: 0.5*2 + 2*1 - 1*1 = 2
    assert total == [2.0, -2.0, 2.0]
    assert math.isnan(out.parts["trl_fn"][1]) and out.parts["named"] == [1.0, 0.0, 1.0]


def test_duplicate_names_get_distinct_metrics():
    def f(completions, **kw):
        return [1.0] * len(completions)

    assert WeightedRewards([f, f]).names == ["f", "f_2"]


def test_contract_errors_name_the_function_and_stop_the_run():
    def short(completions, **kw):
        return [1.0]

    def text(completions, **kw):
        return ["1"] * len(completions)

    worker = RewardWorker(WeightedRewards([short]), timeout_s=5, workers=1, max_failure_frac=1.0)
    with pytest.raises(RewardFunctionError, match="'short' returned 1 rewards for 2 responses"):
        worker([(["a", "b"], _problems(2), [[1], [2]])], step=1)
    worker = RewardWorker(WeightedRewards([text]), timeout_s=5, workers=1, max_failure_frac=1.0)
    with pytest.raises(RewardFunctionError, match="'text' returned '1' .* at index 0; expected a number"):
        worker([(["a", "b"], _problems(2), [[1], [2]])], step=1)


class _Tok:
    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(ord("a") + i) for i in x) for x in ids]


def test_function_reward_logs_each_functions_mean_over_valid_samples():
    def ones(completions, completion_ids, **kw):
        return [float(len(ids)) for ids in completion_ids]

    def flaky(completions, level, **kw):
        if "abc" in completions:  # breaks on one sample: its group call raises, then that sample's own call
            raise RuntimeError("cannot score 'abc'")
        return [None if lv == 1 else 3.0 for lv in level]

    worker = RewardWorker(WeightedRewards([ones, flaky], [1.0, 10.0]), timeout_s=5, workers=1, max_failure_frac=1.0)
    reward = FunctionReward(worker, _Tok(), group_size=2)
    ids = [[0], [0, 1], [0, 1, 2], [3]]
    batch = Batch(samples=[Sample(prompt_ids=[9], response_ids=x, response_mask=[1] * len(x),
                                  rollout_log_probs=[0.0] * len(x), finished=True) for x in ids],
                  problems=_problems(2) + _problems(2), group_ids=torch.tensor([0, 0, 1, 1]), step=1)
    reward(batch)
    # group 0 ok: ones = [1, 2], flaky = [3, None]; group 1 raised, then 'abc' alone failed (masked) and 'd' scored
    # ones = 1, flaky = None (level 1)
    assert batch.valid.tolist() == [True, True, False, True]
    assert batch.rewards.tolist() == [1 + 30.0, 2.0, 0.0, 1.0]
    assert batch.metrics["train/rewards/ones"] == pytest.approx(4 / 3)
    assert batch.metrics["train/rewards/flaky"] == pytest.approx(3.0)
    assert batch.metrics["reward/failures"] == 1
    worker.close()


BASE = ["run.name=x"]


@pytest.mark.parametrize("overrides, match", [
    (["reward.functions=[tests.byo.rewards:has_digit]", "reward.weights=[1, 2]"],
     "'reward.weights' has 2 entries, expected one per entry of reward.functions \\(1\\)"),
    (["reward.functions=[tests.byo.rewards:has_digit, tests.byo.rewards:nope]"],
     "reward.functions\\[1\\] = 'tests.byo.rewards:nope' cannot be imported"),
    (["reward.functions=[no_colon]"], "'reward.functions\\[0\\]' = 'no_colon': expected 'module:function'"),
    (["reward.functions=[tests.byo.rewards:has_digit]", "reward.weights=[a]"], "'reward.weights\\[0\\]' = 'a'"),
    (["reward.functions=[tests.byo.rewards:has_digit]", "reward.function=tests.e2e.rewards:starts_with_digit"],
     "'reward.function' and 'reward.functions' are both set"),
])
def test_config_errors_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):  # at load, or (an import) by the run plan
        resolve_plan(load_recipe(None, BASE + overrides))


def test_single_reward_function_keeps_working():
    r = load_recipe(None, BASE + ["reward.function=tests.e2e.rewards:starts_with_digit"])
    assert r.reward.function == "tests.e2e.rewards:starts_with_digit" and r.reward.functions == []


def test_reward_function_key_calls_a_trl_style_function_the_trl_way():
    from credo.train.setup import reward_function

    r = load_recipe(None, BASE + ["reward.function=tests.byo.rewards:named_only"])
    fn = reward_function(r, None, resolve_plan(r).reward_functions)
    assert isinstance(fn, WeightedRewards) and fn.names == ["named_only"]
    assert fn(["3", "x"], _problems(4)[3:] + _problems(1), [[1], [2]]).finish(2) == [1.0, 0.0]
    r = load_recipe(None, BASE + ["reward.function=tests.e2e.rewards:starts_with_digit"])
    assert not isinstance(reward_function(r, None, resolve_plan(r).reward_functions), WeightedRewards)  # a group function stays as it is
