"""The gateway end to end: the real `openai` client over HTTP to uvicorn, a tiny policy that really calls a tool,
and the trajectories the gateway assembles checked token by token against what was sampled and against a forward
pass of the model (the behaviour log-probs)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.gateway.common import FIRST, MODEL, TOOL_CALL, TOOLS, one_thread, tool_calling_policy

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def gateway():
    from credo.distributed.rollout import HFBackend
    from credo.gateway import Gateway, backend_sampler

    with one_thread():
        model, tok = tool_calling_policy()
        gw = Gateway(backend_sampler(HFBackend(model, tok)), tok, model_name=MODEL, max_tokens=96,
                     max_context=1024).start()
        try:
            yield gw, model, tok
        finally:
            gw.stop()


def client(gw, episode: str):
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.episode_key(episode), max_retries=0, timeout=60)


def run_agent(c, calls: int = 3, max_tokens: int = 80) -> list[dict]:
    """A scripted agent: it executes `add` when the model calls it, else asks the model to go on; it echoes every
    answer into its history as the OpenAI docs show. Returns the final message list."""
    messages = list(FIRST)
    for _ in range(calls):
        r = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=1.0, logprobs=True,
                                      max_tokens=max_tokens)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        for tc in msg.tool_calls or []:
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(args["a"] + args["b"])})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "go on"})
    return messages


def behaviour_log_probs(model, ids: list[int], positions: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) at each t in `positions`, from one full forward (temperature 1, no top-p)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logits[t - 1, ids[t]].item() for t in positions]


def test_scripted_agent_trajectory_is_exactly_what_was_sampled(gateway):
    from credo.gateway.chat import check_messages, render

    gw, model, tok = gateway
    with one_thread():
        messages = run_agent(client(gw, "exact"))
    calls = gw.store.episode_calls("exact")
    [traj] = gw.store.trajectories("exact")
    assert len(calls) == 3 and [c.kind for c in calls] == ["new", "continuation", "continuation"]
    assert gw.store.counters["gateway/retokenization_drift"] == 0
    assert any(m.get("tool_calls") for m in messages), "the trained policy called its tool"
    resp, mask, lp = traj.response_ids, traj.response_mask, traj.rollout_log_probs
    assert len(resp) == len(mask) == len(lp)
    # mask 1 is exactly the concatenation of every call's sampled ids, with their behaviour log-probs
    sampled = [t for c in calls for t in c.choices[0]["response_ids"]]
    assert [t for t, m in zip(resp, mask) if m] == sampled
    assert [x for x, m in zip(lp, mask) if m] == [x for c in calls for x in c.choices[0]["log_probs"]]
    assert all(x == 0.0 for x, m in zip(lp, mask) if not m)
    # each call's model input was the trajectory up to that call's first sampled token (no re-tokenization)
    full = traj.prompt_ids + resp
    starts = [len(traj.prompt_ids) + s for s, _ in traj.meta["turns"]]
    assert [c.prompt_ids for c in calls] == [full[:s] for s in starts]
    # the log-probs line up with the tokens: a forward pass over the trajectory gives them again
    positions = [len(traj.prompt_ids) + i for i, m in enumerate(mask) if m]
    with one_thread():
        ref = behaviour_log_probs(model, full, positions)
    assert ref == pytest.approx([x for x, m in zip(lp, mask) if m], abs=2e-4)
    # mask 0 is template and tool output: the whole trajectory is the re-rendered conversation, sampled turns aside
    text = tok.decode(full, skip_special_tokens=False)
    assert render(tok, check_messages(messages[:-1] if messages[-1]["role"] == "user" else messages), TOOLS) \
        .startswith(text.rsplit(tok.eos_token, 1)[0])
    zero_text = tok.decode([t for t, m in zip(resp, mask) if not m], skip_special_tokens=False)
    one_text = tok.decode(sampled, skip_special_tokens=False)
    assert TOOL_CALL in one_text and TOOL_CALL not in zero_text
    assert "<|im_start|>tool\n5" in zero_text  # the tool's output is in, with mask 0
    # the client received the same tokens' log-probs
    assert traj.meta["calls"] == [0, 1, 2]


def test_client_that_edits_history_is_split_at_the_drift(gateway):
    from credo.gateway.chat import check_messages, render

    gw, _, tok = gateway
    c = client(gw, "drift")
    before = gw.store.counters["gateway/retokenization_drift"]
    with one_thread():
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12)
        answer = r.choices[0].message.content or ""
        # a client that changes whitespace in the answer it echoes
        edited = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " " + answer + " "},
                  {"role": "user", "content": "more"}]
        c.chat.completions.create(model=MODEL, messages=edited, max_tokens=12)
    assert gw.store.counters["gateway/retokenization_drift"] == before + 1
    calls = gw.store.episode_calls("drift")
    first, second = gw.store.trajectories("drift")
    assert [call.kind for call in calls] == ["new", "drift"]
    # the first segment keeps what was sampled; the second starts from the edited history, tokenized, all prompt
    assert [t for t, m in zip(first.response_ids, first.response_mask) if m] == calls[0].choices[0]["response_ids"]
    assert second.prompt_ids == tok(render(tok, check_messages(edited), None), add_special_tokens=False)["input_ids"]
    assert second.response_mask == [1] * len(second.response_ids)
    assert second.response_ids == calls[1].choices[0]["response_ids"]
    assert second.meta["opened_by"] == "drift"
    edited_text = render(tok, check_messages(edited), None)
    assert edited_text[second.meta["drift_at"]:].startswith(" ")  # the drift point is the inserted space


def test_n_choices_are_segments_and_the_agent_continues_the_one_it_picked(gateway):
    gw, _, _ = gateway
    c = client(gw, "n2")
    with one_thread():
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=2, max_tokens=8,
                                      seed=7)
        picked = r.choices[1].message
        c.chat.completions.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": picked.content or ""},
            {"role": "user", "content": "y"}])
    calls = gw.store.episode_calls("n2")
    assert len(calls[0].choices) == 2 and len(r.choices) == 2
    segs = gw.store.trajectories("n2")
    assert len(segs) == 2 and calls[1].kind == "continuation" and calls[1].segments == [calls[0].segments[1]]
    cont = segs[calls[1].segments[0]]
    assert [t for t, m in zip(cont.response_ids, cont.response_mask) if m] == \
        calls[0].choices[1]["response_ids"] + calls[1].choices[0]["response_ids"]


def test_requests_without_the_key_or_with_bad_input_are_refused_and_serving_goes_on(gateway):
    gw, _, _ = gateway
    errors = gw.store.counters["gateway/errors"]
    wrong = openai.OpenAI(base_url=gw.base_url, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=FIRST)
    import httpx

    assert httpx.post(gw.base_url + "/chat/completions", json={"model": MODEL, "messages": FIRST}).status_code == 401
    c = client(gw, "bad")
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.chat.completions.create(model="gpt-4o", messages=FIRST)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.role"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model=MODEL, messages=FIRST, temperature=-1)
    assert gw.store.counters["gateway/errors"] == errors + 6
    assert gw.store.episode_calls("bad") == []
    with one_thread():  # the gateway still serves
        assert c.chat.completions.create(model=MODEL, messages=FIRST, max_tokens=4).choices[0].message is not None
    assert [m.id for m in c.models.list().data] == [MODEL]


def test_a_stop_string_cuts_the_answer_and_the_record_to_the_tokens_before_it(gateway):
    gw, _, tok = gateway
    with one_thread():
        r = client(gw, "stop").chat.completions.create(model=MODEL, messages=FIRST, tools=TOOLS, stop=['"add"'],
                                                        max_tokens=80, temperature=0)
    [rec] = gw.store.episode_calls("stop")
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == '<tool_call>{"name": '
    assert rec.choices[0]["response_ids"] == tok('<tool_call>{"name": ', add_special_tokens=False)["input_ids"]
    assert len(rec.choices[0]["log_probs"]) == len(rec.choices[0]["response_ids"])


def test_a_failing_backend_is_one_calls_500_and_is_counted(tmp_path):
    from credo.gateway import Gateway
    from tests.gateway.test_capture import bpe_tokenizer

    def broken(prompts, **kw):
        raise RuntimeError("engine died")

    with Gateway(broken, bpe_tokenizer(), model_name=MODEL) as gw:
        with pytest.raises(openai.InternalServerError, match="engine died"):
            client(gw, "x").chat.completions.create(model=MODEL, messages=FIRST)
        assert gw.store.counters["gateway/errors"] == 1 and gw.store.episode_calls("x") == []


def test_episode_ids_from_header_user_and_key_and_concurrent_agents(gateway):
    import threading

    gw, _, _ = gateway
    run_key = openai.OpenAI(base_url=gw.base_url, api_key=gw.api_key, max_retries=0)
    short = {"model": MODEL, "messages": FIRST, "max_tokens": 2}
    with one_thread():
        run_key.chat.completions.create(**short, extra_headers={"X-Episode-Id": "from-header"}, user="ignored")
        run_key.chat.completions.create(**short, user="from-user")
        client(gw, "from-key").chat.completions.create(**short)
        errors = []

        def agent(i):
            try:
                run_agent(client(gw, f"conc-{i}"), calls=2, max_tokens=12)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    for ep in ("from-header", "from-user", "from-key"):
        assert len(gw.store.episode_calls(ep)) == 1, ep
    assert gw.store.episode_calls("ignored") == [] and not errors
    for i in range(3):  # interleaved agents: each episode is one exact trajectory of its own calls
        calls = gw.store.episode_calls(f"conc-{i}")
        [traj] = gw.store.trajectories(f"conc-{i}")
        assert [t for t, m in zip(traj.response_ids, traj.response_mask) if m] == \
            [t for c in calls for t in c.choices[0]["response_ids"]]


def test_sampling_options_it_cannot_honour_are_refused_not_ignored(gateway):
    gw, _, _ = gateway
    c = client(gw, "opts")
    for kwargs, name in (({"presence_penalty": 0.5}, "presence_penalty"), ({"tool_choice": "none"}, "tool_choice"),
                         ({"stream_options": {"include_usage": True}}, "stream_options"),
                         ({"extra_body": {"best_of": 2}}, "best_of")):
        with pytest.raises(openai.BadRequestError, match=name):
            c.chat.completions.create(model=MODEL, messages=FIRST, **kwargs)


def test_text_completions_are_captured_by_the_same_rules(gateway):
    gw, _, tok = gateway
    c = client(gw, "text")
    with one_thread():
        first = c.completions.create(model=MODEL, prompt="once upon", max_tokens=6, logprobs=0, seed=3)
        assert first.choices[0].finish_reason == "length"  # no EOS: the text returned is all that was sampled
        prompt = "once upon" + first.choices[0].text + " then"
        second = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, seed=4)
        with pytest.raises(openai.BadRequestError, match="echo"):
            c.completions.create(model=MODEL, prompt="x", echo=True)
    calls = gw.store.episode_calls("text")
    assert [k.kind for k in calls] == ["new", "continuation"]
    [traj] = gw.store.trajectories("text")
    assert traj.prompt_ids == tok("once upon", add_special_tokens=False)["input_ids"]
    assert traj.response_ids == calls[0].choices[0]["response_ids"] + tok(" then", add_special_tokens=False)[
        "input_ids"] + calls[1].choices[0]["response_ids"]
    assert first.choices[0].logprobs.token_logprobs == calls[0].choices[0]["log_probs"]
    assert second.choices[0].text == tok.decode(calls[1].choices[0]["response_ids"], skip_special_tokens=True)


def test_a_streamed_answer_is_the_unstreamed_one_and_is_captured_the_same(gateway):
    """`stream: true` through the openai client: the chunks rebuild the answer, tool call and log-probs of the same
    call without streaming (same seed, another episode), and both episodes record the same tokens."""
    gw, _, _ = gateway
    kwargs = dict(model=MODEL, messages=FIRST, tools=TOOLS, temperature=1.0, logprobs=True, max_tokens=80)
    with one_thread():
        for seed in range(20):  # the first seed whose answer is a tool call (the policy makes one most times)
            whole = client(gw, "unstreamed").chat.completions.create(**kwargs, seed=seed, user=f"unstreamed{seed}")
            if whole.choices[0].message.tool_calls:
                break
        chunks = list(client(gw, "streamed").chat.completions.create(
            **kwargs, seed=seed, stream=True, stream_options={"include_usage": True}))
    content, calls, logprobs, finish = "", {}, [], None
    for ch in chunks[:-1]:
        [c] = ch.choices
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            calls.setdefault(tc.index, []).append(tc)
        logprobs += c.logprobs.content if c.logprobs and c.logprobs.content else []
        finish = c.finish_reason or finish
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and finish == "tool_calls"
    assert content == (msg.content or "")
    assert [(c[0].id, c[0].function.name, c[0].function.arguments) for c in calls.values()] == \
        [(c.id.replace(f"unstreamed{seed}", "streamed"), c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert [lp.logprob for lp in logprobs] == [lp.logprob for lp in whole.choices[0].logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    [a], [b] = gw.store.episode_calls(f"unstreamed{seed}"), gw.store.episode_calls("streamed")
    assert (a.prompt_ids, a.choices) == (b.prompt_ids, b.choices)


def test_streamed_text_completions_and_bad_stream_settings(gateway):
    gw, _, _ = gateway
    c = client(gw, "text-stream")
    with one_thread():
        whole = c.completions.create(model=MODEL, prompt="once upon", max_tokens=6, seed=5, n=2, user="t-whole")
        parts = list(c.completions.create(model=MODEL, prompt="once upon", max_tokens=6, seed=5, n=2, stream=True,
                                          user="t-stream"))
    assert [(p.choices[0].index, p.choices[0].text, p.choices[0].finish_reason) for p in parts] == \
        [(x.index, x.text, x.finish_reason) for x in whole.choices]
    for bad, name in (({"stream": "yes"}, "stream"), ({"stream": True, "stream_options": {"x": 1}}, "stream_options")):
        with pytest.raises(openai.BadRequestError, match=name):
            c.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body=bad)
