"""The judge reward stage: templates, one batched generate call per step, unparseable -> masked and counted,
timeouts isolated, config errors naming the key."""

import threading
import time

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.distributed.rollout import Sample
from credo.families.judges.prompts import (COMPACT_PAIRWISE, POINTWISE_TEMPLATE, check_template, pairwise_prompt,
                                         pointwise_prompt, render_template)
from credo.tasks import Problem
from credo.rewards.worker import RewardFunctionError
from credo.train.batch import Batch
from credo.families.judges.reward import JudgeReward, judge_requests, judge_rewards
from tests.e2e.common import REPO
from tests.fakes import CharTok, ScriptedBackend, recipe_with


def make_batch(questions, responses, G):
    tok = CharTok()
    samples = [Sample([1], tok(r)["input_ids"], [1] * len(r), [0.0] * len(r), True) for r in responses]
    return Batch(samples=samples, problems=[Problem(q, "") for q in questions],
                 group_ids=torch.arange(len(responses)) // G, step=3)


def test_templates_render_fields_and_keep_boxes():
    text = pointwise_prompt("2+2=", "4", template=POINTWISE_TEMPLATE)
    assert "[Question]\n2+2=\n[Response]\n4\n" in text and text.endswith("from 0 to 10 (integers or half points) in \\boxed{}.")
    assert pairwise_prompt("q", "x", "y", template=COMPACT_PAIRWISE) == "qA:x B:y?"
    # a response that contains a field name is not expanded again
    assert render_template("{question}|{response}", question="{response}", response="r") == "{response}|r"
    assert pointwise_prompt("q", "r", template="{question}{response}{lo}-{hi}", lo=0, hi=7.5) == "qr0-7.5"


@pytest.mark.parametrize("template, mode, msg", [
    ("{question}", "pointwise", "{response}"),
    ("{question}{response_a}", "pairwise", "{response_b}"),
    ("{question}{response}{answer}", "pointwise", "unknown field(s) {answer}"),
])
def test_bad_templates_name_the_field(template, mode, msg):
    with pytest.raises(ConfigError) as e:
        check_template(template, mode)
    assert "judge.template" in str(e.value) and msg in str(e.value)


def test_pairwise_requests_pair_each_response_with_the_next_in_its_group():
    prompts, targets = judge_requests(["q0"] * 3 + ["q1"] * 3, list("abcdef"), group_size=3, mode="pairwise",
                                      template="{question}{response_a}{response_b}", opponents=2)
    expected = []
    for g in (0, 1):
        for s in (1, 2):
            for k in range(3):
                expected.append((3 * g + k, 3 * g + (k + s) % 3))
    assert targets == expected
    assert prompts[0] == "q0ab" and prompts[6 + 2] == "q1fd"


def test_pairwise_rewards_match_a_hand_count():
    # comparisons (0,1): A wins; (1,2): unparseable; (2,0): B wins -> 0 beats 2 -> wins: 0:2/2, 1:0/1, 2:0/1
    r, v, bad = judge_rewards(["\\boxed{A}", "no box", "\\boxed{B}"], [(0, 1), (1, 2), (2, 0)], 3, mode="pairwise")
    assert (r, v, bad) == ([1.0, 0.0, 0.0], [True, True, True], 1)
    r, v, bad = judge_rewards(["\\boxed{A} \\boxed{B}"], [(0, 1)], 2, mode="pairwise")  # two verdicts
    assert (v, bad) == ([False, False], 1)


def test_one_generate_call_per_step_for_all_groups_and_unparseable_masked():
    answers = {"a": "good \\boxed{10}", "b": "\\boxed{7.5}", "c": "", "d": "\\boxed{11}", "e": "\\boxed{٧}",
               "f": "\\boxed{3} \\boxed{0}"}
    backend = ScriptedBackend(lambda p: answers[p[-2]])
    judge = JudgeReward(backend, CharTok(), CharTok(), group_size=3, mode="pointwise", template="{question}{response}?",
                        max_new_tokens=16, temperature=0.0)
    batch = make_batch(["1+1="] * 3 + ["2+2="] * 3, list("abcdef"), 3)
    judge(batch)
    assert backend.calls == 1 and backend.sizes == [6]
    assert batch.rewards.tolist() == [1.0, 0.75, 0.0, 0.0, 0.0, 0.0]
    assert batch.valid.tolist() == [True, True, False, False, False, True]
    assert batch.metrics["reward/unparseable_frac"] == pytest.approx(3 / 6)
    assert batch.metrics["reward/failures"] == 0
    judge.close()


def test_a_hung_judge_times_out_masks_the_step_and_stops_after_consecutive_failures():
    release = threading.Event()
    backend = ScriptedBackend(lambda p: "\\boxed{10}")
    hang = {"on": True}

    def generate(prompts, **kw):
        if hang["on"]:
            release.wait(5)
        return ScriptedBackend.generate(backend, prompts, **kw)

    backend.generate = generate
    judge = JudgeReward(backend, CharTok(), CharTok(), group_size=2, mode="pointwise", template="{question}{response}",
                        max_new_tokens=8, temperature=0.0, timeout_s=0.2, max_consecutive_failures=2)
    batch = make_batch(["q"] * 4, list("abcd"), 2)
    t0 = time.monotonic()
    judge(batch)
    assert time.monotonic() - t0 < 2
    assert batch.valid.tolist() == [False] * 4 and batch.rewards.tolist() == [0.0] * 4
    # counted in samples (4), as FunctionReward counts them, not in groups (2)
    assert batch.metrics["reward/timeouts"] == 4 and batch.metrics["reward/failures"] == 4
    hang["on"] = False
    judge(make_batch(["q"] * 4, list("abcd"), 2))  # a good step resets the count
    hang["on"] = True
    judge(make_batch(["q"] * 4, list("abcd"), 2))
    with pytest.raises(RewardFunctionError, match="2 steps in a row"):
        judge(make_batch(["q"] * 4, list("abcd"), 2))
    release.set()
    judge.close()


def test_a_raising_judge_is_masked_not_fatal():
    def boom(prompts, **kw):
        raise RuntimeError("judge crashed")

    backend = ScriptedBackend(lambda p: "")
    backend.generate = boom
    judge = JudgeReward(backend, CharTok(), CharTok(), group_size=2, mode="pairwise",
                        template="{question}{response_a}{response_b}", max_new_tokens=8, temperature=0.0)
    batch = make_batch(["q"] * 4, list("abcd"), 2)
    judge(batch)
    assert batch.valid.tolist() == [False] * 4 and batch.metrics["reward/failures"] == 4
    judge.close()


def test_missing_judge_path_names_the_key():
    with pytest.raises(ConfigError, match="'judge.path' is required"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["stages.reward=judge"])
    with pytest.raises(ConfigError, match="judge.opponents"):
        load_recipe(REPO / "recipes" / "quickstart.yaml",
                    ["stages.reward=judge", "judge.path=tiny", "judge.mode=pairwise", "judge.opponents=8"])
    with pytest.raises(ConfigError, match="unknown config key 'judge.temprature'"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["judge.temprature=0"])


def test_judging_task_items_are_consistent():
    from credo.families.judges.tasks import CRITIQUES, ArithmeticJudgeTask

    pw = ArithmeticJudgeTask(300, 20, 0, mode="pairwise", critique=True, max_operand=49, fixed_width=True)
    pt = ArithmeticJudgeTask(300, 20, 0, mode="pointwise", max_operand=49, fixed_width=True)
    for i in range(300):
        p = pw.train(i)
        a, b = p.meta["responses"]
        right = {"A": a, "B": b}[p.meta["label"]]
        wrong = {"A": b, "B": a}[p.meta["label"]]
        assert right == p.meta["reference"] and wrong != right
        assert p.answer == f"{CRITIQUES[p.meta['error']]} \\boxed{{{p.meta['label']}}}" and pw.score(p.answer, p) == 1.0
        q = pt.train(i)
        assert (q.meta["candidate"] == q.meta["reference"]) == (q.meta["label"] == 10)
        assert pt.score(q.answer, q) == 1.0 and pt.score("\\boxed{11}", q) == 0.0
    assert pw.train(5).prompt == pw.train(5).prompt and pw.train(5).prompt != pw.train(6).prompt


def test_a_judge_context_too_short_is_an_error_at_start():
    from credo.config import JudgeConfig, TinyModelConfig
    from credo.models import build_char_tokenizer, resolve_model_path
    from credo.tasks import ArithmeticTask
    from credo.families.judges.reward import check_judge_context
    from credo.train.registry import StageContext

    tiny = TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
                           max_position_embeddings=64)
    path = resolve_model_path("tiny", tiny)
    task = ArithmeticTask(50, 5, 0, max_operand=9)
    tok = build_char_tokenizer()
    template = "{question}{response}?"
    ok = StageContext(rank=0, world=1, recipe=recipe_with(rollout={"max_new_tokens": 8}), task=task,
                      section=JudgeConfig(path="tiny", max_new_tokens=40, template=template))
    check_judge_context(tok, path, ok, template)  # "9+9=" 4 + "?" 1 + 8 + 40 = 53 <= 64
    bad = StageContext(rank=0, world=1, recipe=recipe_with(rollout={"max_new_tokens": 8}), task=task,
                       section=JudgeConfig(path="tiny", max_new_tokens=60, template=template))
    with pytest.raises(ConfigError, match="judge.max_new_tokens=60 = 73 > the judge's context of 64"):
        check_judge_context(tok, path, bad, template)


class RecordingBackend(ScriptedBackend):
    """A ScriptedBackend that keeps each generate call's sampling arguments."""

    def __init__(self, answer):
        super().__init__(answer)
        self.kwargs = []

    def generate(self, prompts, **kw):
        self.kwargs.append(kw)
        return super().generate(prompts, **kw)


def test_a_sampling_judge_seeds_each_request_and_a_greedy_one_does_not():
    def kw(temperature, seed, step):
        backend = RecordingBackend(lambda p: "\\boxed{5}")
        judge = JudgeReward(backend, CharTok(), CharTok(), group_size=2, mode="pointwise", template="{question}{response}",
                            max_new_tokens=4, temperature=temperature, seed=seed)
        judge.generate(["a", "b", "c"], step)
        return backend.kwargs[0]

    greedy = kw(0.0, 0, 1)  # the backends decode greedily without seeds; the temperature must still be valid
    assert greedy["seeds"] is None and greedy["temperature"] == 1.0 and greedy["top_p"] == 1.0
    hot = kw(0.7, 0, 1)
    assert hot["temperature"] == 0.7 and hot["top_p"] == 1.0
    seeds = hot["seeds"]
    assert len(seeds) == 3 and len(set(seeds)) == 3 and all(isinstance(s, int) for s in seeds)
    assert kw(0.7, 0, 1)["seeds"] == seeds  # reproducible
    assert not set(kw(0.7, 0, 2)["seeds"]) & set(seeds) and not set(kw(0.7, 1, 1)["seeds"]) & set(seeds)


def test_a_judge_returning_the_wrong_number_of_texts_says_how_many():
    class Short(ScriptedBackend):
        def generate(self, prompts, **kw):
            return super().generate(prompts[:-1], **kw)

    judge = JudgeReward(Short(lambda p: "\\boxed{5}"), CharTok(), CharTok(), group_size=2, mode="pointwise",
                        template="{question}{response}", max_new_tokens=4, temperature=0.0)
    with pytest.raises(RewardFunctionError, match=r"the judge returned list of 3 texts for 4 prompts"):
        judge(make_batch(["q"] * 4, list("abcd"), 2))
    judge.close()


def test_judge_warm_up_trains_on_the_judging_task_and_logs_as_judge(monkeypatch, caplog):
    import logging

    import credo.sft
    from credo.config import JudgeConfig
    from credo.families.judges.tasks import ArithmeticJudgeTask
    from credo.families.judges.reward import warm_up_judge
    from credo.train.registry import StageContext

    seen = {}

    def fake_sft(r, base, task, log):
        seen.update(r=r, base=base, task=task)
        log("step 3/3")
        return "/warm/judge", None

    monkeypatch.setattr(credo.sft, "run_sft", fake_sft)
    j = JudgeConfig(path="tiny", warmup_steps=3, warmup_lr=3e-4, warmup_batch_size=6, warmup_seed=11)
    ctx = StageContext(rank=0, world=1, section=j,
                       recipe=recipe_with(task=dict(name="arithmetic", train_size=40, eval_size=4,
                                                    kwargs={"max_operand": 9, "ops": "+", "fixed_width": True})))
    with caplog.at_level(logging.INFO, logger="credo"):
        assert warm_up_judge(ctx, "/base") == "/warm/judge"
    assert seen["base"] == "/base" and seen["r"].task.name == "judge_arithmetic"
    assert isinstance(seen["task"], ArithmeticJudgeTask) and seen["r"].sft.steps == 3
    # the policy task's operand settings, the judge's format, and the judge's own warm-up settings
    assert seen["r"].task.kwargs == {"max_operand": 9, "ops": "+", "fixed_width": True, "mode": j.mode,
                                     "template": j.template}
    sft = seen["r"].sft
    assert (sft.enabled, sft.lr, sft.batch_size, sft.seed) == (True, 3e-4, 6, 11)
    assert "judge step 3/3" in [r.getMessage() for r in caplog.records]


def test_judge_stage_builds_the_judge_with_the_reward_timeout(monkeypatch):
    import credo.models
    import credo.families.judges.reward as jr
    from credo.config import JudgeConfig
    from credo.train.registry import StageContext

    backend = ScriptedBackend(lambda p: "\\boxed{5}")
    monkeypatch.setattr(credo.models, "resolve_model_path", lambda path, tiny: f"/resolved/{path}")
    monkeypatch.setattr(credo.models, "load_tokenizer", lambda path: CharTok())
    monkeypatch.setattr(jr, "check_judge_context", lambda *a: None)
    monkeypatch.setattr(jr, "load_judge", lambda ctx, path: (backend, CharTok(), path))
    ctx = StageContext(rank=0, world=1, tokenizer=CharTok(),
                       recipe=recipe_with(run={"seed": 5}, rollout={"group_size": 2},
                                          reward={"timeout_s": 2.5, "workers": 1, "max_failure_frac": 0.5}),
                       section=JudgeConfig(path="tiny", max_new_tokens=6, temperature=0.3))
    judge = jr.judge_stage(ctx)
    try:
        assert judge.worker.timeout_s == 2.5 and judge.backend is backend and judge.G == 2
        assert (judge.max_new_tokens, judge.temperature, judge.seed) == (6, 0.3, 5)
    finally:
        judge.close()


def test_solve_first_targets_start_with_the_right_sum_and_keep_the_verdict():
    from credo.families.judges.tasks import ArithmeticJudgeTask

    plain = ArithmeticJudgeTask(50, 5, 0, mode="pointwise", max_operand=49, fixed_width=True)
    solve = ArithmeticJudgeTask(50, 5, 0, mode="pointwise", solve_first=True, max_operand=49, fixed_width=True)
    for i in range(50):
        p, q = plain.train(i), solve.train(i)
        a, b = (int(x) for x in q.meta["question"].rstrip("=").split("+"))
        assert q.prompt == p.prompt and q.answer == f"={a + b:03d} {p.answer}"
        assert solve.score(q.answer, q) == 1.0
