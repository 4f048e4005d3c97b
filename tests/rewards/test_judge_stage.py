"""The judge reward stage in detail (credo.families.judges.reward): question text, request layout and reward arithmetic
against hand counts, every metric and error message of `JudgeReward`, the arguments of the judge's generate call,
the context check's boundaries, the warm-up recipe and the stage built from a recipe's `judge:` section on a real
tiny judge."""

import json
import logging

import pytest
import torch

import credo.sft
from credo.config import ConfigError, JudgeConfig, TaskConfig, TinyModelConfig
from credo.distributed.rollout import HFBackend, Sample
from credo.models import build_char_tokenizer, resolve_model_path
from credo.families.judges.prompts import DEFAULTS, PAIRWISE_TEMPLATE, POINTWISE_TEMPLATE
from credo.tasks import ArithmeticTask, Problem
from credo.rewards.worker import RewardFunctionError
from credo.train import judge_reward as jr
from credo.train.batch import Batch
from credo.families.judges.reward import (JudgeReward, check_judge_context, judge_requests, judge_rewards,
                                      judge_warmup_recipe, load_judge, question_text)
from credo.train.registry import StageContext, resolve
from tests.fakes import CharTok, recipe_with


class Backend:
    """Answers each judge prompt with `answer(prompt)`; records each generate call's arguments."""

    def __init__(self, answer=lambda p: "\\boxed{5}"):
        self.answer, self.calls, self.closed = answer, [], 0

    def generate(self, prompts, **kw):
        texts = ["".join(chr(i) for i in p) for p in prompts]
        self.calls.append(dict(kw, prompts=texts))
        out = []
        for t in texts:
            a = self.answer(t)
            out.append(Sample(list(map(ord, t)), [ord(c) for c in a], [1] * len(a), [0.0] * len(a), True))
        return out

    def close(self):
        self.closed += 1


def make_batch(questions, responses, G, step=3):
    samples = [Sample([1], [ord(c) for c in r], [1] * len(r), [0.0] * len(r), True) for r in responses]
    return Batch(samples=samples, problems=[Problem(q, "") for q in questions],
                 group_ids=torch.arange(len(responses)) // G, step=step)


def judge(backend, G=2, mode="pointwise", template="{question}{response}", **kw):
    kw.setdefault("max_new_tokens", 4)
    kw.setdefault("temperature", 0.0)
    return JudgeReward(backend, CharTok(), CharTok(), group_size=G, mode=mode, template=template, **kw)


# ---- question_text, judge_requests, judge_rewards ----

def test_question_text_of_a_string_and_of_chat_messages():
    assert question_text(Problem("7+8=", "")) == "7+8="
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user"}, {"role": "user", "content": 12}]
    assert question_text(Problem(msgs, "")) == "be brief\n\n12"


def test_requests_reject_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match=r"^responses has 5 entries, expected a multiple of group_size=2$"):
        judge_requests(["q"] * 5, list("abcde"), group_size=2, mode="pointwise", template="{question}{response}")


def test_pointwise_requests_use_the_score_range_default_0_10():
    prompts, targets = judge_requests(["q0", "q1"], ["a", "b"], group_size=2, mode="pointwise",
                                      template="{question}{response}{lo}-{hi}")
    assert prompts == ["q0a0-10", "q1b0-10"] and targets == [(0,), (1,)]
    prompts, _ = judge_requests(["q"], ["a"], group_size=1, mode="pointwise", template="{lo}-{hi}", lo=1, hi=5.5)
    assert prompts == ["1-5.5"]


def test_pairwise_requests_default_to_one_opponent_within_each_group():
    prompts, targets = judge_requests(["q"] * 2 + ["r"] * 2, list("abcd"), group_size=2, mode="pairwise",
                                      template="{question}:{response_a}/{response_b}")
    assert targets == [(0, 1), (1, 0), (2, 3), (3, 2)]
    assert prompts == ["q:a/b", "q:b/a", "r:c/d", "r:d/c"]


def test_pointwise_rewards_scale_the_score_into_its_range():
    texts = ["\\boxed{1}", "\\boxed{5}", "\\boxed{3.5}", "\\boxed{0}", "\\boxed{6}"]
    r, v, bad = judge_rewards(texts, [(i,) for i in range(5)], 5, mode="pointwise", lo=1, hi=5)
    # (s - 1) / 4; 0 and 6 lie outside [1, 5] and do not parse
    assert r == [0.0, 1.0, 0.625, 0.0, 0.0] and v == [True, True, True, False, False] and bad == 2
    r, v, bad = judge_rewards(["\\boxed{10}", "\\boxed{2.5}", "\\boxed{11}"], [(0,), (1,), (2,)], 3, mode="pointwise")
    assert r == [1.0, 0.25, 0.0] and v == [True, True, False] and bad == 1


def test_pairwise_rewards_average_each_samples_comparisons():
    # 0 vs 1: B wins (1); 1 vs 2: A wins (1); 2 vs 0: B wins (0); 0 vs 2: A wins (0)
    # wins: 0: 2 of 3, 1: 2 of 2, 2: 0 of 3
    r, v, bad = judge_rewards(["\\boxed{B}", "\\boxed{A}", "\\boxed{B}", "\\boxed{A}"],
                              [(0, 1), (1, 2), (2, 0), (0, 2)], 4, mode="pairwise")
    assert r == pytest.approx([2 / 3, 1.0, 0.0, 0.0]) and v == [True, True, True, False] and bad == 0


# ---- JudgeReward ----

def test_defaults_of_a_judge():
    j = judge(Backend())
    try:
        assert (j.lo, j.hi, j.opponents, j.seed, j.max_consecutive_failures) == (0, 10, 1, 0, 3)
        assert j.worker.timeout_s == 10.0 and j.consecutive_failures == 0 and j.generate_calls == 0
    finally:
        j.close()


def test_generate_passes_the_judges_settings_and_seeds_by_hand():
    be = Backend(lambda p: "\\boxed{7}")
    j = judge(be, max_new_tokens=9, temperature=0.5, seed=2)
    try:
        assert j.generate(["ab", "c"], 4) == ["\\boxed{7}", "\\boxed{7}"]
        call = be.calls[0]
        assert call["prompts"] == ["ab", "c"] and call["max_new_tokens"] == 9
        assert call["temperature"] == 0.5 and call["top_p"] == 1.0
        base = 2 * 1_000_003 + 4 * 100_003
        assert call["seeds"] == [base, base + 1]
        assert j.tok.encodes == [False, False] and j.tok.decodes == [True] and j.generate_calls == 1
        j.generate(["x"], 0)
        assert j.generate_calls == 2 and be.calls[1]["seeds"] == [2 * 1_000_003]
    finally:
        j.close()


def test_a_scored_step_logs_every_metric():
    be = Backend(lambda p: {"a": "\\boxed{10}", "b": "nothing", "c": "\\boxed{2.5}", "d": "\\boxed{0}"}[p[-1]])
    j = judge(be)
    batch = make_batch(["q"] * 4, list("abcd"), 2)
    j(batch)
    try:
        assert j.policy_tok.decodes == [True]
        assert be.calls[0]["prompts"] == ["qa", "qb", "qc", "qd"]
        assert batch.rewards.dtype == torch.float32 and batch.valid.dtype == torch.bool
        assert batch.rewards.tolist() == [1.0, 0.0, 0.25, 0.0] and batch.valid.tolist() == [True, False, True, True]
        m = batch.metrics
        assert (m["reward/failures"], m["reward/timeouts"], m["reward/judge_calls"]) == (0, 0, 4)
        assert m["reward/unparseable_frac"] == 0.25
        assert 0 < m["perf/judge_s"] < 5
        assert m["perf/judgements_per_s"] == pytest.approx(4 / m["perf/judge_s"])
    finally:
        j.close()


def test_a_pairwise_step_with_two_opponents():
    # group of 3; every judgement prefers the response shown as A -> each response wins as A, loses as B
    be = Backend(lambda p: "\\boxed{A}")
    j = judge(be, G=3, mode="pairwise", template="{response_a}{response_b}", opponents=2)
    batch = make_batch(["q"] * 3, list("abc"), 3)
    j(batch)
    try:
        assert be.calls[0]["prompts"] == ["ab", "bc", "ca", "ac", "ba", "cb"]
        assert batch.rewards.tolist() == [0.5, 0.5, 0.5] and batch.metrics["reward/judge_calls"] == 6
    finally:
        j.close()


def test_a_pointwise_step_scores_in_the_judges_range():
    be = Backend(lambda p: "\\boxed{3}")
    j = judge(be, template="{response}{lo}{hi}", lo=1, hi=5)
    batch = make_batch(["q"] * 2, ["a", "b"], 2)
    j(batch)
    try:
        assert be.calls[0]["prompts"] == ["a15", "b15"] and batch.rewards.tolist() == [0.5, 0.5]
    finally:
        j.close()


def test_failing_steps_mask_count_and_stop_at_the_default_limit():
    def boom(prompts, **kw):
        raise RuntimeError("judge crashed")

    be = Backend()
    be.generate = boom
    j = judge(be)
    try:
        for _ in range(2):
            batch = make_batch(["q"] * 4, list("abcd"), 2)
            j(batch)
            assert batch.valid.tolist() == [False] * 4 and batch.rewards.tolist() == [0.0] * 4
            m = batch.metrics
            assert (m["reward/failures"], m["reward/timeouts"], m["reward/unparseable_frac"]) == (4, 0, 0.0)
            assert type(m["reward/failures"]) is int  # a count of samples
            assert m["reward/judge_calls"] == 4
        with pytest.raises(RewardFunctionError, match=r"^the judge call failed \(error\) 3 steps in a row "
                           r"\(judge\.max_consecutive_failures=3\) at step 7; the judge is broken$"):
            j(make_batch(["q"] * 4, list("abcd"), 2, step=7))
    finally:
        j.close()


def test_a_judge_returning_a_non_list_names_its_type():
    class Gen(CharTok):
        def batch_decode(self, rows, skip_special_tokens=False):
            return (t for t in super().batch_decode(rows))

    class Tup(CharTok):
        def batch_decode(self, rows, skip_special_tokens=False):
            return tuple(super().batch_decode(rows))

    for tok, want in ((Gen(), "generator of \\? texts"), (Tup(), "tuple of 2 texts")):
        j = JudgeReward(Backend(), tok, CharTok(), group_size=2, mode="pointwise", template="{question}{response}",
                        max_new_tokens=4, temperature=0.0)
        try:
            with pytest.raises(RewardFunctionError, match=rf"^the judge returned {want} for 2 prompts$"):
                j(make_batch(["q"] * 2, list("ab"), 2))
        finally:
            j.close()


def test_an_empty_shard_makes_an_empty_call():
    be = Backend()
    j = judge(be)
    batch = make_batch([], [], 2)
    j(batch)
    try:
        assert be.calls[0]["prompts"] == [] and batch.rewards.tolist() == [] and batch.valid.tolist() == []
        m = batch.metrics
        assert (m["reward/failures"], m["reward/unparseable_frac"], m["reward/judge_calls"]) == (0, 0.0, 0)
        assert m["perf/judgements_per_s"] == 0.0
    finally:
        j.close()


def test_close_closes_the_backend():
    be = Backend()
    judge(be).close()
    assert be.closed == 1


# ---- check_judge_context ----

TINY = TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny_path():
    return resolve_model_path("tiny", TINY)


def ctx_for(task, mode="pointwise", **judge_kw):
    return StageContext(rank=0, world=1, recipe=recipe_with(rollout={"max_new_tokens": 8}), task=task,
                        section=JudgeConfig(path="tiny", mode=mode, **judge_kw))


def test_the_context_check_passes_at_the_limit_and_fails_one_past_it(tiny_path):
    tok, task = build_char_tokenizer(), ArithmeticTask(50, 5, 0, max_operand=9)
    t = "{question}{response_a}{response_b}"
    # pairwise: prompt "9+9=" 4 + 2 responses of 8 + 44 = 64
    check_judge_context(tok, tiny_path, ctx_for(task, "pairwise", max_new_tokens=44, template=t), t)
    with pytest.raises(ConfigError, match=r"^judge context too short: a judge prompt of 4 tokens \+ the response\(s\) "
                       r"\(rollout\.max_new_tokens=8\) \+ judge\.max_new_tokens=45 = 65 > the judge's context of 64 "
                       r"tokens; shorten judge\.template or judge\.max_new_tokens$"):
        check_judge_context(tok, tiny_path, ctx_for(task, "pairwise", max_new_tokens=45, template=t), t)
    # pointwise with the score range in the prompt: "9+9=" + "0-100" 9 + 8 + 47 = 64
    t = "{question}{response}{lo}-{hi}"
    check_judge_context(tok, tiny_path, ctx_for(task, max_new_tokens=47, score_range=[0, 100]), t)
    with pytest.raises(ConfigError, match=r"prompt of 9 tokens .* = 65 > "):
        check_judge_context(tok, tiny_path, ctx_for(task, max_new_tokens=48, score_range=[0, 100]), t)


class LongTail:
    """A task whose first 500 prompts are short and the rest long: the check reads only the first 500."""

    def __len__(self):
        return 600

    def train(self, i):
        return Problem("x" * (2 if i < 500 else 60), "")


def test_the_context_check_reads_the_first_500_problems(tiny_path):
    check_judge_context(build_char_tokenizer(), tiny_path, ctx_for(LongTail(), max_new_tokens=54),
                        "{question}{response}")  # 2 + 8 + 54 = 64


def test_the_context_check_skips_a_judge_without_a_known_context(tmp_path):
    task, tok = ArithmeticTask(50, 5, 0, max_operand=9), build_char_tokenizer()
    huge = ctx_for(task, max_new_tokens=100_000)
    assert check_judge_context(tok, str(tmp_path / "missing"), huge, "{question}{response}") is None  # OSError
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))  # no max_position_embeddings
    assert check_judge_context(tok, str(tmp_path), huge, "{question}{response}") is None


# ---- the warm-up recipe, load_judge, the stage ----

def test_the_warmup_recipe_for_each_judging_task():
    j = JudgeConfig(path="org/judge", mode="pairwise", template="{question}{response_a}{response_b}", warmup_steps=5,
                    warmup_batch_size=7, warmup_lr=1e-3, warmup_seed=4, warmup_kwargs={"wrong_frac": 0.3})
    t = TaskConfig(name="arithmetic", train_size=30, eval_size=3, seed=9,
                   kwargs={"max_operand": 19, "ops": "+", "fixed_width": True, "digits": 2})
    r = judge_warmup_recipe(j, t)
    assert r.run.name == "judge-warmup" and r.model.path == "org/judge" and r.model.tiny is j.tiny
    assert (r.task.name, r.task.train_size, r.task.eval_size, r.task.seed, r.task.chat_template) == \
        ("judge_arithmetic", 30, 3, 9, False)
    # the policy task's operand settings only, the judge's format and judge.warmup_kwargs
    assert r.task.kwargs == {"max_operand": 19, "ops": "+", "fixed_width": True, "mode": "pairwise",
                             "template": "{question}{response_a}{response_b}", "wrong_frac": 0.3}
    assert (r.sft.enabled, r.sft.steps, r.sft.batch_size, r.sft.lr, r.sft.seed) == (True, 5, 7, 1e-3, 4)
    ce = judge_warmup_recipe(j, t, "ce_rm_arithmetic")  # CE-RM's formats are fixed: no mode or template
    assert ce.task.name == "ce_rm_arithmetic"
    assert ce.task.kwargs == {"max_operand": 19, "ops": "+", "fixed_width": True, "wrong_frac": 0.3}
    j.warmup_kwargs = {"mode": "pointwise", "ops": "-"}  # judge.warmup_kwargs win over both
    assert judge_warmup_recipe(j, t).task.kwargs == {"max_operand": 19, "ops": "-", "fixed_width": True,
                                                     "mode": "pointwise", "template": j.template}


def test_warm_up_judge_builds_the_named_task(monkeypatch, caplog):
    seen = {}

    def fake_sft(r, base, task, log):
        seen.update(name=r.task.name, task=type(task).__name__, base=base)
        log("done")
        return "/warm", None

    monkeypatch.setattr(credo.sft, "run_sft", fake_sft)
    ctx = StageContext(rank=0, world=1, section=JudgeConfig(path="tiny", warmup_steps=1),
                       recipe=recipe_with(task=dict(name="arithmetic", train_size=20, eval_size=2,
                                                    kwargs={"max_operand": 9})))
    with caplog.at_level(logging.INFO, logger="credo"):
        assert jr.warm_up_judge(ctx, "/b", "ce_rm_arithmetic") == "/warm"
    assert seen == {"name": "ce_rm_arithmetic", "task": "CriteriaJudgeTask", "base": "/b"}
    assert [r.getMessage() for r in caplog.records if r.name == "credo"] == ["judge done"]


def test_load_judge_serves_a_frozen_tiny_model_with_hf(tiny_path):
    ctx = StageContext(rank=0, world=1, section=JudgeConfig(path="tiny", tiny=TINY))
    backend, tok, path = load_judge(ctx, tiny_path)
    assert isinstance(backend, HFBackend) and path == tiny_path and tok.eos_token_id is not None
    assert not backend.model.training and not any(p.requires_grad for p in backend.model.parameters())


def test_load_judge_warms_up_first_when_asked(monkeypatch, tiny_path):
    seen = {}

    def fake_sft(r, base, task, log):
        seen.update(base=base, name=r.task.name)
        return tiny_path, None  # the "warmed" judge

    monkeypatch.setattr(credo.sft, "run_sft", fake_sft)
    ctx = StageContext(rank=0, world=1, section=JudgeConfig(path="tiny", tiny=TINY, warmup_steps=2),
                       recipe=recipe_with(task=dict(name="arithmetic", train_size=20, eval_size=2,
                                                    kwargs={"max_operand": 9})))
    _, _, path = load_judge(ctx, "/base")
    assert path == tiny_path and seen == {"base": "/base", "name": "judge_arithmetic"}


def test_the_stage_is_registered_and_builds_from_the_judge_section(caplog):
    from credo.family import builtin_families

    assert resolve("reward", "judge", "stages.reward", builtin_families()).factory is jr.judge_stage
    big = TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
                          max_position_embeddings=1024)
    ctx = StageContext(rank=0, world=1, tokenizer=CharTok(), task=ArithmeticTask(20, 2, 0, max_operand=9),
                       recipe=recipe_with(run={"seed": 6}, rollout={"group_size": 2, "max_new_tokens": 4},
                                          reward={"timeout_s": 30.0, "workers": 1, "max_failure_frac": 0.5}),
                       section=JudgeConfig(path="tiny", tiny=big, mode="pairwise", max_new_tokens=3, temperature=0.4,
                                         score_range=[1, 7], opponents=1, max_consecutive_failures=5))
    j = jr.judge_stage(ctx)
    try:
        assert j.template == PAIRWISE_TEMPLATE == DEFAULTS["pairwise"] and j.mode == "pairwise"
        assert isinstance(j.backend, HFBackend) and j.policy_tok is ctx.tokenizer and j.G == 2
        assert (j.max_new_tokens, j.temperature, j.lo, j.hi, j.opponents, j.max_consecutive_failures, j.seed) == \
            (3, 0.4, 1, 7, 1, 5, 6)
        assert j.worker.timeout_s == 30.0
        batch = make_batch(["1+2="] * 2, ["3", "4"], 2)
        j(batch)  # a random judge: whatever it writes, the step runs through the real model
        assert batch.metrics["reward/judge_calls"] == 2 and batch.metrics["reward/failures"] == 0
        assert batch.rewards.shape == (2,) and j.generate_calls == 1
    finally:
        j.close()


def test_the_stage_defaults_to_the_pointwise_template_and_checks_the_context_first():
    small = TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
                            max_position_embeddings=128)
    ctx = StageContext(rank=0, world=1, tokenizer=CharTok(), task=ArithmeticTask(20, 2, 0, max_operand=9),
                       recipe=recipe_with(rollout={"group_size": 2, "max_new_tokens": 4}, reward={"timeout_s": 1.0}),
                       section=JudgeConfig(path="tiny", tiny=small))
    # the full pointwise template alone is longer than 128 tokens
    n = len(POINTWISE_TEMPLATE.replace("{lo}", "0").replace("{hi}", "10").replace("{question}", "9+9=")
            .replace("{response}", ""))
    need = n + 4 + 256
    with pytest.raises(ConfigError, match=rf"^judge context too short: a judge prompt of {n} tokens .* = {need} > the "
                       r"judge's context of 128 tokens"):
        jr.judge_stage(ctx)
    ctx.section.template, ctx.section.max_new_tokens = "{question}{response}", 8  # an explicit template wins
    j = jr.judge_stage(ctx)
    try:
        assert j.template == "{question}{response}" and j.mode == "pointwise" and (j.lo, j.hi) == (0, 10)
    finally:
        j.close()


def test_load_judge_rejects_a_tokenizer_larger_than_the_judges_vocabulary(tiny_path, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(tiny_path, tmp_path / "judge")
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.add_tokens([f"<extra{i}>" for i in range(300)])
    tok.save_pretrained(tmp_path / "judge")
    ctx = StageContext(rank=0, world=1, section=JudgeConfig(path="tiny", tiny=TINY))
    with pytest.raises(ConfigError, match=rf"^vocab mismatch at '{tmp_path / 'judge'}': tokenizer has "):
        load_judge(ctx, str(tmp_path / "judge"))


def test_judge_rewards_counts_every_unparseable_judgement():
    from credo.families.judges.reward import judge_rewards

    # three pointwise judgements of samples 0, 1, 1: two do not parse
    rewards, valid, bad = judge_rewards(["no score here", "\\boxed{5}", "\\boxed{7.3}"], [(0,), (1,), (1,)], 2,
                                        mode="pointwise")
    assert bad == 2 and valid == [False, True] and rewards == [0.0, 0.5]
    # pairwise: (0 vs 1) A wins, (1 vs 0) and (0 vs 1) give no verdict
    rewards, valid, bad = judge_rewards(["\\boxed{A}", "\\boxed{a}", "tie"], [(0, 1), (1, 0), (0, 1)], 2,
                                        mode="pairwise")
    assert bad == 2 and valid == [True, True] and rewards == [1.0, 0.0]
