"""The agent contract: agents (real `openai` clients) run once per task against the gateway, concurrently up to a
limit; a reward, a dict of named rewards, an agent that raises, one that returns no reward and one that hangs past
its timeout (its later call refused with 409), each isolated and counted."""

from __future__ import annotations

import threading
import time

import pytest

from tests.gateway.common import MODEL, one_thread, untrained_policy

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

RELEASE = threading.Event()
LATE: list[int] = []
ACTIVE = {"now": 0, "peak": 0}
_lock = threading.Lock()


def agent(*, base_url, api_key, model, task):
    """Plays two turns, then behaves as task["kind"] says."""
    with _lock:
        ACTIVE["now"] += 1
        ACTIVE["peak"] = max(ACTIVE["peak"], ACTIVE["now"])
    try:
        c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
        messages = [{"role": "user", "content": task["q"]}]
        for _ in range(2):
            r = c.chat.completions.create(model=model, messages=messages, max_tokens=4)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": "more"}]
        kind = task["kind"]
        if kind == "raises":
            raise RuntimeError("the env crashed")
        if kind == "no_reward":
            return "great"
        if kind == "hangs":
            RELEASE.wait(30)
            try:
                c.chat.completions.create(model=model, messages=messages, max_tokens=4)
            except openai.APIStatusError as e:
                LATE.append(e.status_code)
            return 1.0
        return {"win": 1.0, "length": -0.25} if kind == "named" else 0.5
    finally:
        with _lock:
            ACTIVE["now"] -= 1


def test_episodes_run_concurrently_and_each_failure_is_isolated_and_counted():
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler
    from credo.gateway.agents import run_episodes

    kinds = ["float", "named", "raises", "no_reward", "float", "hangs"]
    tasks = [{"q": f"task {i}", "kind": k} for i, k in enumerate(kinds)]
    with one_thread():
        model, tok = untrained_policy()
        with Gateway(backend_sampler(HFBackend(model, tok)), tok, model_name=MODEL, max_tokens=8) as gw:
            results = run_episodes("tests.gateway.test_agents:agent", tasks, gw, model=MODEL, max_concurrent=2,
                                   timeout_s=6.0)  # well-behaved agents take < 1 s; room for a loaded CI host
            RELEASE.set()
            deadline = time.monotonic() + 20
            while not LATE and time.monotonic() < deadline:
                time.sleep(0.05)
    by_kind = dict(zip(kinds[:4], results[:4]))
    assert [r.reward for r in results] == [0.5, 0.75, 0.0, 0.0, 0.5, 0.0]
    assert by_kind["named"].rewards == {"win": 1.0, "length": -0.25}
    assert "RuntimeError: the env crashed" in by_kind["raises"].error
    assert "expected a float or a dict" in by_kind["no_reward"].error
    assert "timeout" in results[5].error and LATE == [409]  # the abandoned agent's late call is refused
    assert gw.store.counters["gateway/agent_failures"] == 3 and gw.store.counters["gateway/agent_timeouts"] == 1
    assert ACTIVE["peak"] <= 2
    for r in results:
        assert r.trajectories, r.episode  # every episode made its two calls before it failed, or not
        assert all(t.meta["episode"] == r.episode for t in r.trajectories)
        assert all(t.meta["failed"] == (r.error is not None) for t in r.trajectories)
        assert sum(t.meta["turn_rewards"][-1] for t in r.trajectories[:1]) == r.reward
        assert sum(len(t.meta["calls"]) for t in r.trajectories) >= 2


def test_entry_points_that_cannot_be_loaded_name_themselves():
    from credo.gateway.agents import load_agent, named_rewards

    for spec, msg in (("no_colon", "expected 'package.module:function'"), ("nope.missing:run", "cannot be loaded"),
                      ("tests.gateway.test_agents:nothing", "cannot be loaded"),
                      ("tests.gateway.test_agents:LATE", "not a function")):
        with pytest.raises(ValueError, match=msg):
            load_agent(spec)
    with pytest.raises(ValueError, match="non-finite"):
        named_rewards({"a": float("nan")})
    with pytest.raises(ValueError, match="expected a float"):
        named_rewards(True)


def test_bad_tasks_and_reused_episode_ids_are_refused_before_any_agent_runs():
    from credo.gateway.agents import run_episodes
    from credo.gateway.capture import EpisodeStore

    class FakeGateway:  # run_episodes refuses before it touches anything but the store
        store = EpisodeStore(None)

    FakeGateway.store.close("p-1")
    with pytest.raises(ValueError, match=r"tasks\[1\] is a str"):
        run_episodes(agent, [{}, "row"], FakeGateway(), model=MODEL)
    with pytest.raises(ValueError, match="'p-1' is already in use"):
        run_episodes(agent, [{}, {}], FakeGateway(), model=MODEL, prefix="p")
    with pytest.raises(ValueError, match="max_concurrent"):
        run_episodes(agent, [{}], FakeGateway(), model=MODEL, max_concurrent=0)
