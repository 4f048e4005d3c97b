"""Issue 57 A.9: a multi-turn rollout dump reads as a transcript: role-marked turns, each agent turn's tool call, the
tool's or env's reply and the turn's reward. Played on the real shop env by its scripted expert, then dumped by
`credo.train.dump.dump_rollouts` as a run writes it."""

from __future__ import annotations

import json
import random

import torch

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.shop.tools import NAMES, ToolCall, parse_tool_call
from credo.families.multiturn.episodes import Episode
from credo.families.multiturn.transcript import episode_turns, tool_call
from credo.train.batch import Batch
from credo.train.dump import dump_rollouts, render_transcript


def played_episode(seed: int = 3) -> tuple[Episode, list[tuple[str, str, float]]]:
    """The shop's expert plays one episode; the episode as the source records it, and (action, reply, reward)
    written down independently as the env returned them."""
    env = make_env("credo:Shop-v0-easy")
    first, _ = env.reset(seed=seed)
    e = Episode(env=env, env_seed=seed, first_observation=first)
    rng, log = random.Random(0), []
    for _ in range(12):
        action = env.expert_action(rng, 0.0)
        obs, reward, terminated, truncated, _ = env.step(action)
        e.actions.append(action)
        e.observations.append(obs)
        e.turn_rewards.append(float(reward))
        e.turn_spans.append([len(e.response_ids), len(e.response_ids) + 1])
        e.response_ids += [1, 2]
        e.response_mask += [1, 0]
        log.append((action, obs, float(reward)))
        if terminated or truncated:
            e.end = "terminated" if terminated else "env_truncated"
            break
    return e, log


def test_the_turns_alternate_and_carry_each_call_reply_and_reward():
    e, log = played_episode()
    turns = e.sample([0]).meta["turns"]
    assert turns[0] == {"role": "env", "text": e.first_observation}
    agents, replies = turns[1::2], turns[2::2]
    assert [t["role"] for t in agents] == ["agent"] * len(log) and len(replies) == len(log)
    for k, ((action, obs, reward), a, r) in enumerate(zip(log, agents, replies), start=1):
        parsed = parse_tool_call(action)  # the env's own parser, against the transcript's generic one
        assert isinstance(parsed, ToolCall)
        assert a == {"role": "agent", "turn": k, "text": action, "tool_call": a["tool_call"]}
        generic = a["tool_call"]["name"]
        assert (generic == "answer" and parsed.name == "buy") or NAMES[generic] == parsed.name
        assert r["turn"] == k and r["text"] == obs and r["reward"] == reward
        assert r["role"] == ("env" if a["tool_call"]["name"] == "answer" else "tool")
    assert replies[-1]["end"] == e.end


def test_tool_calls_are_read_as_gem_writes_them():
    assert tool_call("I'll look: <search>shoe red size=m</search> then") == {"name": "search", "arguments": "shoe red size=m"}
    assert tool_call("<tool_call><tool_name>view</tool_name><arguments>{\"product_id\": 17}</arguments></tool_call>") \
        == {"name": "view", "arguments": '{"product_id": 17}'}
    assert tool_call("so the answer is \\boxed{4}") == {"name": "answer", "arguments": "4"}
    assert tool_call("4") is None
    turns = episode_turns("guess 1-7", ["4", "\\boxed{6}"], ["higher"], [0.0, 0.0], end="max_total_tokens")
    assert turns[2] == {"role": "env", "turn": 1, "text": "higher", "reward": 0.0}
    assert turns[4] == {"role": "env", "turn": 2, "reward": 0.0, "end": "max_total_tokens"}  # cut: no reply text


class CharTokenizer:
    def batch_decode(self, ids, skip_special_tokens=False):
        return ["".join(chr(97 + i % 26) for i in row) for row in ids]


def test_the_rollout_dump_holds_the_rendered_transcript(tmp_path):
    e, log = played_episode()
    s = e.sample([5])
    s.prompt_ids = [5, 6]
    batch = Batch(samples=[s], problems=[None], group_ids=torch.tensor([0]), step=4,
                  rewards=torch.tensor([sum(e.turn_rewards)]), valid=torch.tensor([True]),
                  loss_mask=torch.ones(1, 4, dtype=torch.bool))
    row = json.loads((dump_rollouts(batch, CharTokenizer(), tmp_path)).read_text())
    assert "turns" not in row["meta"] and row["turns"] == s.meta["turns"]
    lines = row["transcript"].splitlines()
    assert lines[0].startswith("[env] ") and row["transcript"] == render_transcript(row["turns"])
    action, obs, reward = log[0]
    call = tool_call(action)
    i = lines.index(f"[agent 1] {action}")
    assert lines[i + 1] == f"    -> {call['name']}({call['arguments']})"
    assert lines[i + 2] == f"[tool 1, reward {reward:+.3f}] " + obs.replace("\n", "\n    ").split("\n")[0]
    assert f"end: {e.end}" in row["transcript"]
