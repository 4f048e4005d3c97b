"""Chat-template rendering: one function, used by the warm-up, the rollout and evaluation alike."""

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.distributed.rollout import Sample
from credo.models import build_char_tokenizer
from credo.tasks.render import encode_prompts, prompt_renderer, render_prompt
from credo.tasks import Problem
from tests.byo.common import build_bpe_tokenizer

USER = "<|im_start|>user\nwhat is 2+3<|im_end|>\n"
ASSISTANT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return build_bpe_tokenizer(pad=True)


def test_string_prompt_rendered_with_template_and_system_prompt(tok):
    assert render_prompt(tok, "what is 2+3") == USER + ASSISTANT
    assert render_prompt(tok, "what is 2+3", system_prompt="Be brief.") == \
        "<|im_start|>system\nBe brief.<|im_end|>\n" + USER + ASSISTANT


def test_message_list_keeps_its_own_system_message(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "what is 2+3"}]
    assert render_prompt(tok, msgs, system_prompt="ignored") == "<|im_start|>system\nS<|im_end|>\n" + USER + ASSISTANT


def test_chat_template_false_and_no_template_leave_text_as_is(tok):
    assert render_prompt(tok, "12+30=", chat_template=False) == "12+30="
    char = build_char_tokenizer()  # the built-in tiny model's tokenizer has no template: the default path
    assert render_prompt(char, "12+30=", system_prompt="x") == "12+30="


@pytest.mark.parametrize("template, prompt, match", [
    (True, "q", "task.chat_template' = true but the tokenizer has no chat template"),
    ("auto", [{"role": "user", "content": "q"}], "list of chat messages but it cannot be rendered"),
])
def test_unrenderable_prompts_are_errors(template, prompt, match):
    with pytest.raises(ConfigError, match=match):
        render_prompt(build_char_tokenizer(), prompt, chat_template=template)


def test_chat_template_key_accepts_auto_true_false_only():
    assert load_recipe(None, ["run.name=x", "task.chat_template=false"]).task.chat_template is False
    with pytest.raises(ConfigError, match="task.chat_template' = 'maybe' is out of range: expected auto, true or false"):
        load_recipe(None, ["run.name=x", "task.chat_template=maybe"])


class _Recorder:
    """A rollout backend that records the prompt ids it is asked to continue."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, **kw):
        self.prompts += [list(p) for p in prompts]
        return [Sample(prompt_ids=list(p), response_ids=[5], response_mask=[1], rollout_log_probs=[0.0], finished=True)
                for p in prompts]


class _Task:
    score = None

    def __init__(self, problems):
        self.problems = problems

    def __len__(self):
        return len(self.problems)

    def train(self, i):
        return self.problems[i % len(self.problems)]

    def eval_problems(self):
        return self.problems


def test_rollout_and_evaluation_feed_the_rendered_prompt(tok):
    from credo.train.evaluate import Evaluator
    from credo.train.rollout import PromptRollout

    problems = [Problem(prompt=f"what is {i}+1", answer=str(i + 1)) for i in range(3)]
    render = prompt_renderer(tok, "Be brief.", "auto")
    expected = {tuple(tok(render_prompt(tok, p.prompt, system_prompt="Be brief."), add_special_tokens=False)["input_ids"])
                for p in problems}
    backend = _Recorder()
    src = PromptRollout(_Task(problems), tok, backend, seed=0, prompts_per_step=2, group_size=2, max_new_tokens=3,
                        temperature=1.0, top_p=1.0, render=render)
    src.rollout(1)
    assert {tuple(p) for p in backend.prompts} <= expected and len(backend.prompts) == 4
    backend.prompts.clear()
    from credo.rewards.functions import WeightedRewards

    def five(completions, completion_ids, **kw):  # the recorder answers token 5 to everything
        return [1.0 if ids == [5] else 0.0 for ids in completion_ids]

    ev = Evaluator(_Task(problems), tok, src, seed=0, temperature=0.0, samples=1, render=render,
                   reward_fn=WeightedRewards([five], [0.5]))
    assert ev.metric == "eval/reward_mean"
    assert ev() == pytest.approx(0.5)  # the weighted reward of every held-out prompt
    assert {tuple(p) for p in backend.prompts} == expected and len(backend.prompts) == 3


def test_warm_up_demonstrations_use_the_same_rendering(tmp_path, monkeypatch):
    import credo.sft as sft
    from tests.byo.common import make_model_dir, qa_rows, write_jsonl

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "cache"))
    model = make_model_dir(tmp_path / "m", pad=True)
    data = write_jsonl(tmp_path / "d.jsonl", qa_rows(10, seed=0))
    r = load_recipe(None, ["run.name=x", f"model.path={model}", "task.name=file", f"task.kwargs={{train: {data}}}",
                           "task.eval_size=2", "task.system_prompt=Be brief.", "sft.enabled=true", "sft.steps=1",
                           "sft.batch_size=2"])
    seen = []
    real = sft.encode_pair
    monkeypatch.setattr(sft, "encode_pair", lambda t, p, a: seen.append(p) or real(t, p, a))
    from credo.tasks import make_task

    task = make_task(r.task)
    sft.run_sft(r, str(model), task, log=lambda m: None)
    assert len(seen) == 2
    for text in seen:
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nwhat is ")
        assert text.endswith(ASSISTANT)


def test_default_recipe_keeps_its_warm_up_cache_key_inputs():
    """The new task keys enter the SFT key only when set, so warm-ups cached before them still match."""
    from credo.sft import data_digest

    r = load_recipe("recipes/quickstart.yaml", [])
    assert set(data_digest(r)) == {"name", "train_size", "eval_size", "seed", "kwargs"}
    r2 = load_recipe("recipes/quickstart.yaml", ["task.system_prompt=hi"])
    assert data_digest(r2)["system_prompt"] == "hi"


def test_warm_up_key_follows_the_data_files_contents(tmp_path):
    from credo.sft import data_digest
    from tests.byo.common import qa_rows, write_jsonl

    data = write_jsonl(tmp_path / "d.jsonl", qa_rows(4, seed=0))
    r = load_recipe(None, ["run.name=x", "task.name=file", f"task.kwargs={{train: {data}}}", "task.eval_size=1"])
    before = data_digest(r)
    write_jsonl(data, qa_rows(4, seed=1))  # same path, new rows: a new warm-up
    assert data_digest(r) != before
    (tmp_path / "ds").mkdir()
    write_jsonl(tmp_path / "ds" / "train.jsonl", qa_rows(4, seed=0))
    r = load_recipe(None, ["run.name=x", f"task.name=hf:{tmp_path / 'ds'}"])
    before = data_digest(r)
    write_jsonl(tmp_path / "ds" / "train.jsonl", qa_rows(4, seed=2))
    assert data_digest(r) != before
