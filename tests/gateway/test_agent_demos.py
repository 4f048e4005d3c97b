"""The agent family's warm-up demonstrations are the text the gateway will render for the agent: the prompt is what
the agent's first call renders, and prompt + answer + EOS is the whole conversation as the gateway's template
writes it (tool calls as the gateway parses and echoes them)."""

from __future__ import annotations

import json

import pytest

from credo.errors import ConfigError


def test_a_demonstration_is_the_gateways_own_rendering_of_the_agents_conversation():
    from credo.families.agent.task import demonstration_problem
    from credo.gateway.chat import DEFAULT_TEMPLATE, check_messages, parse_tool_calls, render
    from credo.gateway.examples.openai_guess import TOOLS, demonstration
    from credo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    demo = demonstration(3)
    p = demonstration_problem(tok, demo, "agent.demos")
    msgs = demo["messages"]
    assert p.prompt == render(tok, check_messages(msgs[:1]), TOOLS)  # the agent's first call: its user message
    whole = tok.apply_chat_template(msgs, tools=TOOLS, chat_template=DEFAULT_TEMPLATE, tokenize=False,
                                    add_generation_prompt=False)
    assert p.prompt + p.answer + tok.eos_token + "\n" == whole
    # each assistant turn of the answer is a tool call the gateway parses back to the demonstration's own call
    turns = [t.split(tok.eos_token)[0] for t in p.answer.split("<|im_start|>assistant\n")]
    calls = [m["tool_calls"][0]["function"] for m in msgs if m["role"] == "assistant"]
    assert len(turns) == len(calls)
    for text, call in zip(turns, calls):
        content, parsed = parse_tool_calls(text, "c")
        assert content == "" and parsed[0]["function"] == call and json.loads(call["arguments"])["n"] in range(1, 8)


@pytest.mark.parametrize("demo,message", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "ends with an assistant turn"),
    ({"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]}, "messages[0].role"),
    (["not", "a", "dict"], "returned list"),
])
def test_a_malformed_demonstration_is_a_config_error_naming_the_key(demo, message):
    from credo.families.agent.task import demonstration_problem
    from credo.models import build_char_tokenizer

    with pytest.raises(ConfigError, match=r"agent\.demos") as e:
        demonstration_problem(build_char_tokenizer(), demo, "config key 'agent.demos' = 'x:y'")
    assert message in str(e.value)


def test_without_agent_tasks_the_rows_are_the_recipe_tasks_problems():
    from credo.config import load_recipe
    from credo.families.agent.build import task
    from credo.tasks import make_task

    r = load_recipe("recipes/gateway_gem.yaml", ["agent.tasks=null", "agent.demos=null", "task.eval_size=4"])
    agent_task, arithmetic = task(r), make_task(r.task)
    p = arithmetic.train(7)
    assert agent_task.row(7) == {"prompt": p.prompt, "answer": p.answer, **p.meta}
    q = arithmetic.eval_problems()[2]
    assert agent_task.row(2, "eval") == {"prompt": q.prompt, "answer": q.answer, **q.meta}
    assert agent_task.train(7).prompt == p.prompt and len(agent_task) == len(arithmetic)  # the task's own warm-up
