"""The OpenAI Agents SDK example (credo.gateway.examples.agents_sdk_shop): the SDK's unmodified agent loop shops on
credo:Shop-v0-tiny through a running Gateway, over its real HTTP calls. The policy behind the gateway is the tiny
char-level model made to answer with the shop's noiseless expert (its tokens forced, their log-probs the model's
own), so the episode is known: ask the size, search, buy the target (reward 1.0 through the SDK's tool calls into
the env). The trajectory's mask-1 tokens are exactly the forced ones, every call's prompt is the trajectory up to it
(no re-tokenization of the SDK's echoed history: no drift), and the first prompt is the warm-up's rendering of the
SDK's own tool schemas. A tool call the SDK cannot run ends the episode as the env's invalid call; arguments of the
wrong type get the SDK's own error as the tool output until its turn limit."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.gateway.common import MODEL, one_thread

pytest.importorskip("agents")  # openai-agents
pytest.importorskip("uvicorn")

TEMPERATURE = 1.0


def policy():
    """(model, tokenizer): the built-in tiny char-level Qwen2, random weights, context for the SDK's prompts."""
    from transformers import AutoModelForCausalLM

    from credo.config import TinyModelConfig
    from credo.models import build_char_tokenizer, tiny_model_config

    tok = build_char_tokenizer()
    config = tiny_model_config(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=1, num_kv_heads=1,
                                               intermediate_size=64, max_position_embeddings=2304), len(tok), tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), tok


def log_probs(model, ids: list[int], positions: list[int], temperature: float) -> list[float]:
    """log p(ids[t] | ids[:t]) at `positions`, from one forward at `temperature`."""
    with torch.no_grad():
        logits = (model(input_ids=torch.tensor([ids])).logits[0].float() / temperature).log_softmax(-1)
    return [logits[t - 1, ids[t]].item() for t in positions]


class ForcedSampler:
    """A gateway `SampleFn` that answers each call with the next text of `script` (+ EOS) as its tokens, scored by
    the model: what a policy that had learned the expert would sample, with its behaviour log-probs."""

    def __init__(self, model, tok, script: list[str]):
        self.model, self.tok, self.script, self.sampled = model, tok, list(script), []

    def __call__(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        from credo.distributed.rollout import Sample

        out = []
        for prompt in prompts:
            ids = self.tok(self.script.pop(0) + self.tok.eos_token, add_special_tokens=False)["input_ids"]
            full = list(prompt) + ids
            lp = log_probs(self.model, full, list(range(len(prompt), len(full))), temperature or 1.0)
            self.sampled.append(ids)
            out.append(Sample(prompt_ids=list(prompt), response_ids=ids, response_mask=[1] * len(ids),
                              rollout_log_probs=lp, finished=True))
        return out


def expert_script(task: dict) -> tuple[list[str], list[dict]]:
    """The noiseless expert's calls on `task` as Hermes tool-call texts, and as (name, arguments)."""
    from credo.gateway.examples.agents_sdk_shop import Shop, _compact, expert_call

    shop, texts, calls = Shop(task), [], []
    while not shop.done:
        name, arguments = expert_call(shop.env.expert_action(random.Random(0), 0.0))
        texts.append(f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>')
        calls.append({"name": name, "arguments": arguments})
        shop.step(_compact(name, arguments))
    return texts, calls


@pytest.fixture(scope="module")
def served():
    model, tok = policy()
    return model, tok


def run(served, script, episode, task):
    from credo.gateway import Gateway
    from credo.gateway.examples.agents_sdk_shop import run_episode

    model, tok = served
    sampler = ForcedSampler(model, tok, script)
    with one_thread(), Gateway(sampler, tok, model_name=MODEL, max_tokens=96) as gw:
        reward = run_episode(base_url=gw.base_url, api_key=gw.episode_key(episode), model=MODEL, task=task)
        return reward, sampler, gw.store.episode_calls(episode), gw.store.trajectories(episode), dict(gw.store.counters)


def test_the_sdk_agent_buys_the_target_and_its_trajectory_is_exactly_what_was_sampled(served):
    from credo.gateway.chat import check_messages, render
    from credo.gateway.examples.agents_sdk_shop import INSTRUCTIONS, Shop, task_row, tool_schemas

    model, tok = served
    task = task_row(3, "train")
    script, calls_made = expert_script(task)
    assert [c["name"] for c in calls_made] == ["ask_user", "search", "buy"]
    reward, sampler, calls, trajectories, counters = run(served, script, "shop", task)
    assert reward == 1.0  # the SDK ran the model's tool calls against the env: the target was bought
    assert sampler.script == [] and len(calls) == 3  # one gateway call per tool call; none after the purchase
    assert [c.kind for c in calls] == ["new", "continuation", "continuation"]
    assert counters["gateway/retokenization_drift"] == 0 and counters["gateway/forks"] == 0
    [traj] = trajectories
    mask, resp = traj.response_mask, traj.response_ids
    assert [t for t, m in zip(resp, mask) if m] == [t for ids in sampler.sampled for t in ids]
    full = traj.prompt_ids + resp
    starts = [len(traj.prompt_ids) + s for s, _ in traj.meta["turns"]]
    assert [c.prompt_ids for c in calls] == [full[:s] for s in starts]  # the model saw its own tokens back
    positions = [len(traj.prompt_ids) + i for i, m in enumerate(mask) if m]
    with one_thread():
        assert log_probs(model, full, positions, TEMPERATURE) == pytest.approx(
            [x for x, m in zip(traj.rollout_log_probs, mask) if m], abs=2e-4)
    # the SDK's first request is the warm-up's rendering: its instructions, the request, its tools' schemas
    first = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": Shop(task).request}]
    assert tok.decode(traj.prompt_ids, skip_special_tokens=False) == render(tok, check_messages(first), tool_schemas())
    zero_text = tok.decode([t for t, m in zip(resp, mask) if not m], skip_special_tokens=False)
    assert "<|im_start|>tool\nsize: " in zero_text and "#" in zero_text  # the tools' outputs, mask 0
    assert "<tool_call>" not in zero_text


def test_a_tool_call_the_sdk_cannot_run_is_the_envs_invalid_call(served):
    from credo.gateway.examples.agents_sdk_shop import task_row

    reward, _, calls, _, _ = run(served, ['<tool_call>{"name": "fly", "arguments": {}}</tool_call>'], "bad",
                                 task_row(0, "train"))
    assert len(calls) == 1 and reward == pytest.approx(-0.1)  # credo:Shop-v0's invalid_penalty


def test_arguments_of_the_wrong_type_get_the_sdks_error_until_its_turn_limit(served):
    from credo.gateway.examples.agents_sdk_shop import task_row

    bad = '<tool_call>{"name": "buy", "arguments": {"product_id": "the red one"}}</tool_call>'
    reward, _, calls, [traj], counters = run(served, [bad] * 5, "typo", task_row(0, "train"))
    assert len(calls) == 5 and reward == pytest.approx(-0.1)  # max_turns 4 + 1 model calls, then one invalid call
    assert counters["gateway/retokenization_drift"] == 0
    _, tok = served
    zero_text = tok.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if not m])
    assert zero_text.count("<|im_start|>tool\n") == 4 and "bought" not in zero_text  # the SDK's own error, no env


def test_demonstrations_are_the_expert_in_the_sdks_messages():
    from credo.gateway.examples.agents_sdk_shop import INSTRUCTIONS, demonstration, tool_schemas

    demo = demonstration(7, noise=0.0)
    assert demo["tools"] == tool_schemas()
    assert demo["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    names = [m["tool_calls"][0]["function"]["name"] for m in demo["messages"] if m["role"] == "assistant"]
    assert names == ["ask_user", "search", "buy"] and demo["messages"][-1]["role"] == "assistant"
    assert [m["content"].split(":")[0] for m in demo["messages"] if m["role"] == "tool"][:1] == ["size"]


def test_the_recipe_passes_credo_check_and_its_context_holds_the_demonstrations():
    import credo
    from credo.config import load_recipe
    from credo.gateway.chat import check_messages, render
    from credo.gateway.examples.agents_sdk_shop import demonstration
    from credo.models import build_char_tokenizer

    notes = credo.check("recipes/gateway_shop.yaml")  # a ConfigError naming the key would raise
    assert all("warm-up" in n for n in notes), notes
    from credo.families.agent.build import chat_template

    r = load_recipe("recipes/gateway_shop.yaml")
    context, template = r.model.tiny.max_position_embeddings, chat_template(r.agent.chat_template)
    tok = build_char_tokenizer()

    def longest(template):
        return max(len(tok(render(tok, check_messages(d["messages"]), d["tools"], generation_prompt=False,
                                  template=template), add_special_tokens=False)["input_ids"])
                   for d in map(demonstration, range(40)))

    # the recipe's compact tool lines (agent.chat_template) fit its context; the SDK's JSON schemas would not
    assert 700 < longest(template) <= context < 1500 < longest(None)
