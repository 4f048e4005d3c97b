"""An agent written with the OpenAI Agents SDK (`openai-agents` on PyPI, used unmodified) that shops on the shop env.

The shop (`credo:Shop-v0-tiny` here; any level works, docs/shop.md) runs in the agent's own process, and its four
tools are the SDK's function tools: `search(query)`, `view(product_id)`, `ask_user(question)`, `buy(product_id)`.
Each tool makes the env's call and returns the env's observation to the model. The SDK runs its own agent loop
(`Runner.run`): it calls the chat-completions endpoint with the tools, runs the tool calls the model makes, sends the
outputs back, and stops when the model buys, when the env's turn budget is spent, or when the model answers without
a tool call. The episode's reward is the env's return.

Nothing in `run_episode` knows about credo's training: it is the agent a researcher would write against any
OpenAI-compatible endpoint. The only lines about the endpoint are the client's base URL and key and the model name
(`_model`); tracing is off because there is no OpenAI platform to send traces to.

Used by recipes/gateway_shop.yaml: `rollout.agent: credo.gateway.examples.agents_sdk_shop:run_episode`,
`agent.tasks: ...:task_row`, `agent.demos: ...:demonstration` (the shop's scripted expert, noisy, in exactly the
messages and tool schemas the SDK sends, for the warm-up).
"""

from __future__ import annotations

import asyncio
import json
import random

ENV = "credo:Shop-v0-tiny"
ENV_KWARGS = {"max_turns": 4}
INSTRUCTIONS = "Buy what the user wants."
EVAL_SEED_BASE = 10**10     # the shop's held-out users (docs/shop.md)
DEMO_SEED_BASE = 5 * 10**9
DEMO_NOISE = 0.25           # recipes/shop.yaml's expert noise: a quarter of the expert's calls random valid calls
MAX_TOKENS = 96             # per call: the longest expert call is a 90-character tool call (200 demonstrations)


class Shop:
    """One episode of the shop env and its return; `step` is what every tool calls."""

    def __init__(self, task: dict):
        from credo.families.multiturn.envs import make_env  # GEM's protocol: reset(seed), step(text)

        self.env = make_env(task["env"], **task.get("env_kwargs", {}))
        self.request, _ = self.env.reset(seed=task["seed"])
        self.total, self.done = 0.0, False

    def step(self, action: str) -> str:
        if self.done:  # a call after the episode ended (the model called two tools at once): nothing happens
            return "the episode is over"
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.total += reward
        self.done = terminated or truncated
        return observation


def shop_tools(shop: Shop) -> list:
    """The shop's four tools as the SDK's function tools (their schemas come from these signatures and docstrings).
    They are coroutines that never wait: the SDK runs a sync tool in a worker thread, so two tool calls of one answer
    could step the env at the same time; coroutines on the episode's one event loop never overlap."""
    from agents import function_tool

    @function_tool
    async def search(query: str) -> str:
        """Search the catalogue."""
        return shop.step(f"<search>{query}</search>")

    @function_tool
    async def view(product_id: int) -> str:
        """Show a product."""
        return shop.step(f"<view>{product_id}</view>")

    @function_tool
    async def ask_user(question: str) -> str:
        """Ask the user."""
        return shop.step(f"<ask>{question}</ask>")

    @function_tool
    async def buy(product_id: int) -> str:
        """Buy a product."""
        return shop.step(f"<buy>{product_id}</buy>")

    return [search, view, ask_user, buy]


def shop_agent(shop: Shop, model):
    """The SDK's `Agent` with the shop's tools; its loop stops as soon as the env's episode has ended."""
    from agents import Agent, ToolsToFinalOutputResult

    def stop_when_done(context, results) -> ToolsToFinalOutputResult:
        return ToolsToFinalOutputResult(is_final_output=shop.done, final_output="done" if shop.done else None)

    return Agent(name="shopper", instructions=INSTRUCTIONS, tools=shop_tools(shop), model=model,
                 tool_use_behavior=stop_when_done)


def _model(base_url: str, api_key: str, model: str, max_tokens: int):
    """The one place the endpoint is named: the SDK's chat-completions model over an `AsyncOpenAI` client."""
    from agents import ModelSettings, OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    return client, OpenAIChatCompletionsModel(model=model, openai_client=client), ModelSettings(max_tokens=max_tokens)


async def _play(*, base_url: str, api_key: str, model: str, task: dict) -> float:
    from agents import RunConfig, Runner
    from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

    shop = Shop(task)
    client, chat_model, settings = _model(base_url, api_key, model, task.get("max_tokens", MAX_TOKENS))
    try:
        await Runner.run(shop_agent(shop, chat_model), input=shop.request, max_turns=shop.env.max_turns + 1,
                         run_config=RunConfig(model_settings=settings, tracing_disabled=True))
    except (MaxTurnsExceeded, ModelBehaviorError):
        # the SDK gave up: a call to a tool it does not have (ModelBehaviorError), or more model calls than the env
        # has turns (arguments of the wrong type are answered by the SDK's own error message, and the env is not
        # called, so such calls can repeat). For the shop that is one invalid call, judged by the env's own rule.
        shop.step("")
    finally:
        await client.close()
    return shop.total


def run_episode(*, base_url: str, api_key: str, model: str, task: dict) -> float:
    """credo's call: one shopping episode through the SDK's agent loop; the env's return."""
    return asyncio.run(_play(base_url=base_url, api_key=api_key, model=model, task=task))


# ---------------------------------------------------------------------------------------- for the recipe
def task_row(index: int, split: str) -> dict:
    """The `task` of training episode `index` (split 'train') or held-out episode `index` ('eval')."""
    seed = index if split == "train" else EVAL_SEED_BASE + index
    return {"env": ENV, "env_kwargs": dict(ENV_KWARGS), "seed": seed}


def tool_schemas() -> list[dict]:
    """The tools exactly as the SDK sends them in a chat-completions request (its own converter)."""
    from agents.models.chatcmpl_converter import Converter

    shop = Shop(task_row(0, "train"))
    return [Converter.tool_to_openai(t) for t in shop_tools(shop)]


TOOL_OF_TAG = {"search": ("search", "query"), "view": ("view", "product_id"), "ask": ("ask_user", "question"),
               "buy": ("buy", "product_id")}


def expert_call(action: str) -> tuple[str, dict]:
    """(tool name, arguments) of one of the shop expert's compact calls (`<search>...</search>`, `\\boxed{17}`)."""
    from credo.families.multiturn.envs.shop.tools import parse_tool_call

    call = parse_tool_call(action)
    if isinstance(call, str):
        raise ValueError(f"the shop expert's call {action!r} is invalid: {call}")
    if call.name == "search":
        return "search", {"query": call.query}
    if call.name == "ask_user":
        return "ask_user", {"question": call.question}
    return call.name, {"product_id": call.product}


def demonstration(index: int, noise: float = DEMO_NOISE) -> dict:
    """A warm-up conversation: the shop's scripted expert (a random valid call with probability `noise`) in exactly
    the messages the SDK sends: its instructions as the system message, the request, tool calls and tool outputs."""
    shop = Shop({"env": ENV, "env_kwargs": ENV_KWARGS, "seed": DEMO_SEED_BASE + index})
    rng = random.Random(DEMO_SEED_BASE + index)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": shop.request}]
    turn = 0
    while not shop.done:
        name, arguments = expert_call(shop.env.expert_action(rng, noise))
        call_id = f"call-{turn}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        observation = shop.step(_compact(name, arguments))
        if not shop.done:  # the SDK sends the last tool output to no one: the loop stops when the episode ends
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
        turn += 1
    return {"messages": messages, "tools": tool_schemas()}


def _compact(name: str, arguments: dict) -> str:
    """The env call a tool makes for these arguments (the same text as shop_tools' functions)."""
    tag = {"ask_user": "ask"}.get(name, name)
    return f"<{tag}>{next(iter(arguments.values()))}</{tag}>"
