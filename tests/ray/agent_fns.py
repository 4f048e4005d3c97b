"""Agents the Ray agent tests run on Ray workers (and in threads, to compare): a light module, imported by entry point
('tests.ray.agent_fns:scripted') on the workers."""

from __future__ import annotations

import os
import time


def _log(task: dict, what: str) -> None:
    if task.get("log"):
        with open(task["log"], "a") as f:
            f.write(f"{what} {os.getpid()} {time.time():.6f}\n")


def scripted(*, base_url, api_key, model, task):
    """Three calls, each echoing the answer and an observation (a tool-like user turn), the last one with a tool
    offered; then behaves as task['kind'] says: 'ok' returns a reward from the task's seed, 'named' two named rewards,
    'raises' raises after its calls, 'hangs' sleeps past any test timeout (its pid in the log first)."""
    import openai

    _log(task, "start")
    kind = task.get("kind", "ok")
    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"game {task['seed']}"}]
    tools = [{"type": "function", "function": {"name": "add"}}]
    for turn in range(3):
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=3, tools=tools if turn == 2 else None)
        messages += [{"role": "assistant", "content": r.choices[0].message.content or "-"},
                     {"role": "user", "content": f"obs {turn}"}]
    if kind == "raises":
        _log(task, "end")
        raise RuntimeError(f"the agent's tool crashed on {task['seed']}")
    if kind == "hangs":
        _log(task, "hang")
        time.sleep(300)
        c.chat.completions.create(model=model, messages=messages, max_tokens=3)  # never reached: the task is killed
    _log(task, "end")
    if kind == "named":
        return {"win": 1.0, "length": -0.25 * len(messages)}
    return float(task["seed"] % 3) / 2


def task_row(index: int, split: str) -> dict:
    """agent.tasks for the recipe tests: a seed per row (held-out rows offset)."""
    return {"seed": index + (1000 if split == "eval" else 0)}


def sampled_reward(*, base_url, api_key, model, task):
    """Three calls like `scripted`, and a reward that depends on what was sampled (how many of the answers' characters
    are digits, out of all), so the episodes of a group differ and the update moves the weights."""
    import openai

    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"game {task['seed']}"}]
    text = ""
    for turn in range(3):
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=4)
        answer = r.choices[0].message.content or "-"
        text += answer
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"obs {turn}"}]
    return sum(ch.isdigit() or ch in "+=" for ch in text) / max(len(text), 1)


def on_node(*, base_url, api_key, model, task):
    """One call, then the id of the Ray node it ran on appended to task['log']; reward 1.0."""
    import openai
    import ray

    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": f"game {task['seed']}"}], max_tokens=3)
    with open(task["log"], "a") as f:
        f.write(ray.get_runtime_context().get_node_id() + "\n")
    return 1.0
