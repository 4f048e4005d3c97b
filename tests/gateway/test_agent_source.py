"""The `agent` rollout source (credo.families.agent.source): real `openai` agents through a Gateway on a rollout
backend. The batch's mask-1 tokens are exactly what the agents' calls sampled (checked against the backend's own
record of every generate call and the log-probs each agent read in its answers); rewards and groups are the
agents'; agents that raise, hang past their timeout, call an unknown model or send a malformed message fail their own
episodes, counted, and
the step goes on; per-turn rewards reported through POST /credo/reward land on the turns they name."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from tests.gateway.common import MODEL, one_thread, untrained_policy

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

SEEN: dict[str, list[list[float]]] = {}
"""episode id -> the log-probs the agent read in each of its answers."""
_lock = threading.Lock()


def scripted_agent(*, base_url, api_key, model, task):
    """Three calls (each echoing the answer and a tool-like user turn), then behaves as task['kind'] says."""
    kind = task.get("kind", "ok")
    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    messages = [{"role": "user", "content": f"game {task['seed']}"}]
    seen = []
    for turn in range(3):
        if kind == "malformed":
            messages = [{"role": "wizard", "content": "hello"}]
        r = c.chat.completions.create(model="gpt-4o" if kind == "unknown_model" else model, messages=messages,
                                      max_tokens=3, logprobs=True)
        seen.append([t.logprob for t in r.choices[0].logprobs.content])
        messages += [{"role": "assistant", "content": r.choices[0].message.content or "-"},
                     {"role": "user", "content": f"obs {turn}"}]
        if kind == "per_turn":
            root = base_url.rsplit("/v1", 1)[0]
            httpx.post(f"{root}/credo/reward", json={"reward": 0.5 * (turn + 1)},
                       headers={"Authorization": f"Bearer {api_key}"}, timeout=10).raise_for_status()
    with _lock:
        SEEN[api_key.split(":", 1)[1]] = seen  # the episode id credo put in the key
    if kind == "raises":
        raise RuntimeError("the agent's tool crashed")
    if kind == "hangs":
        threading.Event().wait(20)
    return float(task["seed"] % 3)


class RecordingBackend:
    """The HF backend, recording every sampled response (ids and log-probs) of every generate call."""

    def __init__(self, backend):
        self.backend, self.sampled = backend, []

    def generate(self, prompts, **kw):
        out = self.backend.generate(prompts, **kw)
        self.sampled += [(list(s.response_ids), list(s.rollout_log_probs)) for s in out]
        return out

    def sync_weights(self, model, version):
        self.backend.sync_weights(model, version)

    def close(self):
        pass


class Rows:
    """An AgentTask's row interface over a list of task dicts, handed out in turn whatever index the step draws (the
    draw is with replacement), so each step of P = len(rows) rows has every row once."""

    def __init__(self, rows):
        self.rows, self.given = rows, 0

    def __len__(self):
        return len(self.rows)

    def row(self, index, split="train"):
        self.given += 1
        return dict(self.rows[(self.given - 1) % len(self.rows)])


def make_source(rows, *, G=2, P=None, timeout_s=20.0, max_failure_frac=1.0):
    from credo.distributed.rollout import HFBackend
    from credo.families.agent.config import AgentConfig
    from credo.families.agent.source import AgentRollout

    model, tok = untrained_policy()
    backend = RecordingBackend(HFBackend(model, tok))
    cfg = AgentConfig(max_concurrent=4, timeout_s=timeout_s, max_failure_frac=max_failure_frac, max_tokens=8,
                      model_name=MODEL)
    src = AgentRollout(cfg, "tests.gateway.test_agent_source:scripted_agent", Rows(rows), tok, backend, seed=3,
                       prompts_per_step=P or len(rows), group_size=G, temperature=1.0, top_p=1.0, max_context=512)
    return src, backend


def runs_of_ones(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def assert_agents_read_their_trajectories(batch):
    """What each agent read in answer k's log-probs is the mask-1 run of call k in its episode's trajectories (an
    episode is split where its agent's echo differs from what was sampled, e.g. '-' for an empty answer)."""
    by_call: dict[str, dict[int, list[float]]] = {}
    for s in batch.samples:
        assert len(s.meta["calls"]) == len(s.meta["turn_spans"]) == len(runs_of_ones(list(s.response_mask)))
        for call, (a, b) in zip(s.meta["calls"], s.meta["turn_spans"]):
            assert all(s.response_mask[a:b]) and call not in by_call.get(s.meta["episode"], {})
            by_call.setdefault(s.meta["episode"], {})[call] = s.rollout_log_probs[a:b]
    assert set(by_call) == set(SEEN)
    for episode, calls in by_call.items():
        assert sorted(calls) == list(range(len(SEEN[episode])))
        for k, read in enumerate(SEEN[episode]):
            assert read == pytest.approx(calls[k], abs=1e-6), (episode, k)


def test_the_batch_trains_exactly_the_tokens_the_agents_calls_sampled():
    from credo.families.agent.source import AgentReward

    SEEN.clear()
    with one_thread():
        src, backend = make_source([{"seed": 4}, {"seed": 5}], G=2)
        try:
            batch = src.rollout(step=0)
        finally:
            src.close()
    AgentReward()(batch)
    assert len(batch.samples) >= 4 and batch.valid.all()
    # every generate call's sample is one turn of exactly one trajectory, token for token, with its log-probs
    turns = []
    for s in batch.samples:
        for a, b in runs_of_ones(list(s.response_mask)):
            turns.append((s.response_ids[a:b], s.rollout_log_probs[a:b]))
        assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.response_mask) if not m)
    assert sorted(t[0] for t in turns) == sorted(ids for ids, _ in backend.sampled) and len(turns) == 12
    for ids, lps in turns:
        assert (ids, lps) in [(i, [pytest.approx(x) for x in l]) for i, l in backend.sampled]
    assert_agents_read_their_trajectories(batch)
    # G episodes per row in one group; rewards are what the agents returned
    rows = [s.meta["task"]["seed"] for s in batch.samples]
    assert sorted(set(rows)) == [4, 5] and len({s.meta["episode"] for s in batch.samples}) == 4
    assert sorted(s.meta["task"]["seed"] for s in batch.samples if s.meta["segment"] == 0) == [4, 4, 5, 5]
    assert {int(g) for g, r in zip(batch.group_ids, rows) if r == 4}.isdisjoint(
        {int(g) for g, r in zip(batch.group_ids, rows) if r == 5})
    assert batch.rewards.tolist() == [float(r % 3) for r in rows]
    assert batch.metrics["agent/failures"] == 0 and batch.metrics["gateway/requests"] == 12
    assert batch.metrics["agent/reward_mean"] == pytest.approx(sum(r % 3 for r in rows) / 4)


def test_failing_agents_fail_their_own_episodes_counted_and_the_step_goes_on():
    from credo.errors import EnvFailureError
    from credo.families.agent.source import AgentReward

    rows = [{"seed": 1}, {"seed": 2, "kind": "raises"}, {"seed": 7, "kind": "hangs"}, {"seed": 8, "kind": "unknown_model"},
            {"seed": 9, "kind": "malformed"}]
    with one_thread():
        src, _ = make_source(rows, G=1, timeout_s=1.5)
        try:
            batch = src.rollout(step=0)
            AgentReward()(batch)
            src.cfg.max_failure_frac = 0.5  # four of five fail: over the budget, the run stops naming the agent
            src.task = Rows([rows[0], rows[1], rows[1], rows[3], rows[4]])  # none hangs: a short test
            with pytest.raises(EnvFailureError, match=r"agent 'tests.gateway.test_agent_source:scripted_agent': 4 of 5 "
                                                      r"episodes failed at step 1 .*first error: the agent raised"):
                src.rollout(step=1)
        finally:
            src.close()
    by_seed = {s.meta["task"]["seed"]: s for s in batch.samples}
    assert batch.metrics["agent/failures"] == 4 and batch.metrics["agent/timeouts"] == 1
    assert batch.metrics["gateway/errors"] == 2, batch.metrics  # the unknown model's 404, the malformed message's 400
    assert "RuntimeError: the agent's tool crashed" in by_seed[2].meta["error"]
    assert "NotFoundError" in by_seed[8].meta["error"] and "gpt-4o" in by_seed[8].meta["error"]
    assert by_seed[8].response_ids == [] and by_seed[8].meta["failed"]  # no call was served: a placeholder
    assert "BadRequestError" in by_seed[9].meta["error"] and "messages[0].role" in by_seed[9].meta["error"]
    assert [not s.meta["failed"] for s in batch.samples] == batch.valid.tolist()
    assert batch.valid.tolist() == [s.meta["task"]["seed"] == 1 for s in batch.samples]


def test_per_turn_rewards_reported_to_the_callback_land_on_their_turns():
    with one_thread():
        src, _ = make_source([{"seed": 6, "kind": "per_turn"}], G=1)
        try:
            batch = src.rollout(step=0)
            gw = src.gateway
            root = gw.base_url.rsplit("/v1", 1)[0]
            key = {"Authorization": f"Bearer {gw.episode_key('nobody')}"}
            refused = [httpx.post(f"{root}/credo/reward", json={"reward": 1.0}).status_code,
                       httpx.post(f"{root}/credo/reward", json={"reward": "a lot"}, headers=key).status_code,
                       httpx.post(f"{root}/credo/reward", json={"reward": 1.0}, headers=key).json()["error"]["message"],
                       httpx.post(f"{root}/credo/reward", json={"reward": 1.0, "turn": 2}, headers=key).status_code]
        finally:
            src.close()
    s, = batch.samples
    # the agent reported 0.5, 1.0, 1.5 after its three calls and returned 0.0 (seed 6 % 3): the last turn has both
    assert s.meta["turn_rewards"] == [0.5, 1.0, 1.5]
    assert refused[0] == 401 and refused[1] == 400 and refused[3] == 400
    assert "has made no call yet" in refused[2]


def test_with_batching_concurrent_agents_share_generate_calls_and_the_batch_is_still_exact():
    from credo.families.agent.source import AgentReward

    SEEN.clear()
    with one_thread():
        src, backend = make_source([{"seed": 4}, {"seed": 5}], G=2)
        src.cfg.batch_window_ms = 200.0
        backend.calls = 0
        generate = backend.generate

        def counted(prompts, **kw):
            backend.calls += 1
            return generate(prompts, **kw)

        backend.generate = counted
        try:
            batch = src.rollout(step=0)
        finally:
            src.close()
    AgentReward()(batch)
    assert batch.metrics["gateway/requests"] == 12 and backend.calls < 12  # four agents' calls, batched
    turns = [s.response_ids[a:b] for s in batch.samples for a, b in runs_of_ones(list(s.response_mask))]
    assert sorted(turns) == sorted(ids for ids, _ in backend.sampled)
    assert_agents_read_their_trajectories(batch)
