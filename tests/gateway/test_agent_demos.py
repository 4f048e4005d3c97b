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


@pytest.mark.parametrize("example", ["openai_guess", "agents_sdk_shop"])
def test_the_agents_own_turns_are_the_trained_pieces_of_a_demonstration(example):
    """sft.mask_observations on an agent's demonstrations: the trained pieces are exactly the text the policy samples
    through the gateway at each assistant turn (the tool call and its closing EOS; the last one's EOS is the one the
    warm-up appends), everything else (generation prompts, tool outputs, the template's newlines) is masked, and the
    ids are those of the whole-answer warm-up."""
    import importlib

    from credo.config import load_recipe
    from credo.families.agent.task import demonstration_problem
    from credo.gateway.chat import check_messages, render
    from credo.models import build_char_tokenizer
    from credo.sft import demonstration_ids, encode_pair

    mod = importlib.import_module(f"credo.gateway.examples.{example}")
    recipe = {"openai_guess": "recipes/gateway_gem.yaml", "agents_sdk_shop": "recipes/gateway_shop.yaml"}[example]
    r = load_recipe(recipe, ["sft.mask_observations=true"])  # accepted: an agent with demonstrations
    from credo.families.agent.build import task

    assert task(r).train(0).meta["answer_parts"]  # the recipe's warm-up task marks the turns when it masks
    tok = build_char_tokenizer()
    for i in range(4):
        demo = mod.demonstration(i)
        assert "answer_parts" not in demonstration_problem(tok, demo, "agent.demos").meta  # only when masking
        p = demonstration_problem(tok, demo, "agent.demos", turn_parts=True)
        parts = p.meta["answer_parts"]
        assert "".join(t for t, _ in parts) == p.answer
        msgs, tools = check_messages(demo["messages"]), demo.get("tools") or None
        sampled = []  # what each assistant turn's call to the gateway samples: the rendered turn through its EOS
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                before = render(tok, msgs[:k], tools)
                turn = render(tok, msgs[:k + 1], tools, generation_prompt=False)[len(before):]
                sampled.append(turn[:turn.rindex(tok.eos_token) + len(tok.eos_token)])
        trained = [t for t, own in parts if own]
        assert trained == sampled[:-1] + [sampled[-1][:-len(tok.eos_token)]]
        assert all("<|im_start|>" in t for t, own in parts if not own)  # masked: the template's turns, tool outputs
        ids, mask = demonstration_ids(r, tok, p.prompt, p, noisy=False)
        assert ids == encode_pair(tok, p.prompt, p.answer)[0]
        assert tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False) == "".join(sampled)
