"""`agent.chat_template` (as vLLM's `--chat-template`): a template file used instead of the tokenizer's own, for the
gateway's requests and the warm-up's demonstrations alike; a file that cannot be read or parsed is a config error
naming the key before any warm-up; the warm-up key changes with the template and only when one is set."""

from __future__ import annotations

import pytest

from credo.errors import ConfigError

COMPACT = "recipes/templates/compact_tools.jinja"
openai = pytest.importorskip("openai")


def test_the_compact_template_is_the_default_but_for_the_tool_list():
    from credo.families.agent.build import chat_template
    from credo.gateway.chat import check_messages, render
    from credo.gateway.examples.agents_sdk_shop import demonstration
    from credo.models import build_char_tokenizer

    tok, text = build_char_tokenizer(), chat_template(COMPACT)
    demo = demonstration(7)
    msgs = check_messages(demo["messages"])
    default = render(tok, msgs, demo["tools"], generation_prompt=False)
    compact = render(tok, msgs, demo["tools"], generation_prompt=False, template=text)
    # without tools the two templates write the same text, character for character
    assert render(tok, msgs, None, template=text) == render(tok, msgs, None)
    head = f"<|im_start|>tools\n{{}}{tok.eos_token}\n"
    lines = [f"{t['function']['name']}(" + ", ".join(f"{k}: {v['type']}" for k, v in
             t["function"]["parameters"]["properties"].items()) + f"): {t['function']['description']}"
             for t in demo["tools"]]
    assert compact == head.format("".join(x + "\n" for x in lines)) + default.split(tok.eos_token + "\n", 1)[1]
    assert '"additionalProperties"' in default and '"additionalProperties"' not in compact  # the default: JSON
    assert len(compact) < len(default) - 800


def test_a_demonstration_and_a_gateway_request_render_with_the_template(tmp_path):
    """The warm-up's prompt is exactly what the gateway renders for the agent's first call under the template."""
    from credo.distributed.rollout import Sample
    from credo.families.agent.build import chat_template
    from credo.families.agent.task import demonstration_problem
    from credo.gateway import Gateway
    from credo.gateway.examples.agents_sdk_shop import demonstration
    from credo.models import build_char_tokenizer

    tok, text = build_char_tokenizer(), chat_template(COMPACT)
    demo = demonstration(2)
    problem = demonstration_problem(tok, demo, "agent.demos", template=text)
    first = [m for m in demo["messages"] if m["role"] != "assistant"][:2]  # instructions and the request
    seen = []

    def sample(prompts, *, max_new_tokens, temperature, top_p, seeds):  # records the prompt, answers with EOS
        seen.extend(prompts)
        return [Sample(list(p), [tok.eos_token_id], [1], [-0.1], True, 0) for p in prompts]

    with Gateway(sample, tok, model_name="m", chat_template=text) as gw:
        c = openai.OpenAI(base_url=gw.base_url, api_key=gw.episode_key("e"), max_retries=0, timeout=30)
        c.chat.completions.create(model="m", messages=first, tools=demo["tools"], max_tokens=4)
    assert tok.decode(seen[0]) == problem.prompt
    assert "search(query: string): Search the catalogue." in problem.prompt and '"title"' not in problem.prompt


def test_an_unreadable_or_unparsable_template_is_a_config_error_naming_the_key(tmp_path):
    from credo.families.agent.build import chat_template

    with pytest.raises(ConfigError, match=r"agent\.chat_template' = '.*nope\.jinja': cannot read"):
        chat_template(str(tmp_path / "nope.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}\n")  # no endfor
    with pytest.raises(ConfigError, match=r"agent\.chat_template' = .*not a Jinja template: line"):
        chat_template(str(bad))
    assert chat_template(None) is None


def test_credo_check_refuses_a_missing_template_and_the_warmup_key_follows_the_template(tmp_path, capsys):
    from credo.cli import main
    from credo.config import load_recipe
    from credo.families.agent import _warmup_digest

    rc = main(["check", "recipes/gateway_gem.yaml", f"agent.chat_template={tmp_path / 'missing.jinja'}",
               f"run.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "agent.chat_template" in err and "cannot read" in err, err
    plain = _warmup_digest(load_recipe("recipes/gateway_gem.yaml", []))
    assert "agent_chat_template" not in plain  # the default keeps the warm-up keys it had
    other = tmp_path / "other.jinja"
    other.write_text(open(COMPACT).read().replace("): ", ") - "))
    a = _warmup_digest(load_recipe("recipes/gateway_gem.yaml", [f"agent.chat_template={COMPACT}"]))
    b = _warmup_digest(load_recipe("recipes/gateway_gem.yaml", [f"agent.chat_template={other}"]))
    assert a["agent_chat_template"] != b["agent_chat_template"] and {**a, "agent_chat_template": None} == {
        **plain, "agent_chat_template": None}
