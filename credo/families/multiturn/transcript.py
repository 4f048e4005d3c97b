"""A multi-turn episode as a transcript: role-marked turns, the tool call each agent turn makes, the env's (or the
tool's) reply and the turn's reward, for `rollouts/step_*.jsonl` (`run.dump_rollouts_every`) and for people.

    turns = episode_turns(first_observation, actions, observations, turn_rewards, prefix_actions, end)
    [{"role": "env", "text": "You are shopping for ..."},
     {"role": "agent", "turn": 1, "text": "<search>shoe red</search>", "tool_call": {"name": "search", "arguments": "shoe red"}},
     {"role": "tool", "turn": 1, "text": "results: 17 red wool shoe ...", "reward": 0.0},
     {"role": "agent", "turn": 2, "text": "\\boxed{17}", "tool_call": {"name": "answer", "arguments": "17"}},
     {"role": "env", "turn": 2, "text": "bought 17 ...", "reward": 1.0, "end": "terminated"}]

A call is found the way GEM's tools find theirs (the first in the turn's text counts): a tag `<name>args</name>`,
GEM's MCP `<tool_call><tool_name>NAME</tool_name><arguments>JSON</arguments></tool_call>`, or a final `\\boxed{x}`
(named `answer`). The reply to a tag call is the tool's output (role `tool`); any other reply is the env's (role
`env`). `credo.train.dump` writes the rendered text beside each sample (`transcript`).
"""

from __future__ import annotations

import re

CALL = re.compile(r"<tool_call>\s*<tool_name>([^<]+)</tool_name>\s*<arguments>(.*?)</arguments>\s*</tool_call>"
                  r"|<([A-Za-z_]\w*)>(.*?)</\3>|\\boxed\{([^{}]*)\}", re.DOTALL)


def tool_call(text: str) -> dict | None:
    """The first tool call in an agent turn's text: {"name", "arguments"}, or None (plain text)."""
    m = CALL.search(text)
    if m is None:
        return None
    if m.group(1) is not None:
        return {"name": m.group(1).strip(), "arguments": m.group(2).strip()}
    if m.group(3) is not None:
        return {"name": m.group(3), "arguments": m.group(4).strip()}
    return {"name": "answer", "arguments": m.group(5).strip()}


def episode_turns(first_observation: str, actions: list[str], observations: list[str], turn_rewards: list[float],
                  prefix_actions: list[str] = (), end: str | None = None) -> list[dict]:
    """The episode's turns in order (see the module docstring). Expert turns replayed into the prompt (IPA's
    initialised resampling) come first as role `expert`; a turn cut by the token budget has no reply."""
    turns: list[dict] = [{"role": "env", "text": first_observation}]
    turns += [{"role": "expert", "text": a, "tool_call": tool_call(a)} for a in prefix_actions]
    for k, action in enumerate(actions):
        call = tool_call(action)
        turns.append({"role": "agent", "turn": k + 1, "text": action, "tool_call": call})
        reply: dict = {"role": "tool" if call and call["name"] != "answer" else "env", "turn": k + 1}
        if k < len(observations):
            reply["text"] = observations[k]
        if k < len(turn_rewards):
            reply["reward"] = turn_rewards[k]
        if k == len(actions) - 1 and end:
            reply["end"] = end
        if len(reply) > 2:
            turns.append(reply)
    return turns
