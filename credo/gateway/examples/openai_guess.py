"""An agent written with the `openai` package that plays a GEM-protocol guessing game through a tool call.

Nothing in `run_episode` knows about credo's training: it is the agent a researcher would write against any
OpenAI-compatible endpoint. credo passes `base_url` and `api_key` (the gateway's, with the episode in the key),
`model` and `task` (the row of `task_row`); the agent plays the game with its own env and returns the game's return.

The game is `credo:GuessNumber-v0` (GEM's protocol and reward constants, built in: guess a number in 1-7 in three
turns from "higher"/"lower"); any GEM id works the same through `credo.families.multiturn.envs.make_env` (e.g.
`game:GuessTheNumber-v0-easy`, whose longer observations need a model with a longer context than the tiny one's).

Used by recipes/gateway_gem.yaml: `rollout.agent: credo.gateway.examples.openai_guess:run_episode`,
`agent.tasks: ...:task_row`, `agent.demos: ...:demonstration` (the scripted expert's games, in the agent's own
message format, for the warm-up).
"""

from __future__ import annotations

import json
import random

ENV = "credo:GuessNumber-v0"
ENV_KWARGS = {"low": 1, "high": 7, "max_turns": 3}
MAX_TURNS = 3
EVAL_SEED_BASE = 10**9
DEMO_SEED_BASE = 5 * 10**9

TOOLS = [{"type": "function", "function": {"name": "guess", "parameters": {"type": "object",
                                                                          "properties": {"n": {"type": "integer"}}}}}]


def make_game(task: dict):
    from credo.families.multiturn.envs import make_env  # GEM's protocol: reset(seed), step(text)

    return make_env(task["env"], **task.get("env_kwargs", {}))


def guessed_number(message) -> str | None:
    """The `n` argument of the answer's first `guess` tool call, as text; None when there is none."""
    for call in message.tool_calls or []:
        if call.function.name == "guess":
            try:
                return str(json.loads(call.function.arguments)["n"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def run_episode(*, base_url: str, api_key: str, model: str, task: dict) -> float:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    game = make_game(task)
    observation, _ = game.reset(seed=task["seed"])
    messages = [{"role": "user", "content": observation}]
    total = 0.0
    for _ in range(task.get("max_turns", MAX_TURNS)):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=80)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        number = guessed_number(message)
        # no tool call: the text itself is the action, and the game's own rules judge it (GEM: a format error)
        observation, reward, terminated, truncated, _ = game.step(number if number is not None else message.content or "")
        total += reward
        if terminated or truncated or number is None:
            break
        messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": observation})
    return total


# ---------------------------------------------------------------------------------------- for the recipe
def task_row(index: int, split: str) -> dict:
    """The `task` of training episode `index` (split 'train') or held-out episode `index` ('eval')."""
    seed = index if split == "train" else EVAL_SEED_BASE + index
    return {"env": ENV, "env_kwargs": dict(ENV_KWARGS), "seed": seed, "max_turns": MAX_TURNS}


def demonstration(index: int, noise: float = 0.5) -> dict:
    """A warm-up conversation: the game's scripted expert (binary search, a random guess with probability `noise`)
    playing in exactly the messages `run_episode` sends, with `guess` tool calls."""
    game = make_game({"env": ENV, "env_kwargs": ENV_KWARGS})
    rng = random.Random(DEMO_SEED_BASE + index)
    observation, _ = game.reset(seed=DEMO_SEED_BASE + index)
    messages = [{"role": "user", "content": observation}]
    for turn in range(MAX_TURNS):
        number = game.expert_action(rng, noise)
        call_id = f"call-{turn}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "guess", "arguments": json.dumps({"n": int(number)})}}]})
        observation, _, terminated, truncated, _ = game.step(number)
        if terminated or truncated:
            break
        messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
    return {"messages": messages, "tools": TOOLS}
