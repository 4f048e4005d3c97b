"""The OpenAI-compatible HTTP endpoint (FastAPI, served by uvicorn on 127.0.0.1 with a per-run key).

`POST /v1/chat/completions` renders the messages (credo.gateway.chat), builds the prompt ids by the capture rules
(credo.gateway.capture), samples `n` answers through one `SampleFn` (credo.gateway.backend), records them under the
episode and answers in OpenAI's format (tool calls parsed, log-probs when asked; with `stream: true` as server-sent
events, credo.gateway.streaming). `POST /v1/completions` does the
same for a text prompt (no template). `GET /v1/models` lists the one model. A request without the run's key, or
one the gateway cannot serve, is refused with OpenAI's error body (credo.gateway.chat names the key at fault).

The episode of a call is, first found: the `X-Episode-Id` header, the body's `user` field, the part after
`<run key>:` of the API key (credo hands each episode its own key, `Gateway.episode_key(id)`, so an agent that can
only set `base_url` and `api_key` still names its episode), else `"default"`.

Calls are sampled one at a time (one lock around plan, sample and record), or, with `concurrent` and a batching
sampler (credo.gateway.batching), calls of different episodes sample together; `POST /credo/reward` takes an
episode's per-turn rewards.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from credo.gateway.backend import SampleFn
from credo.gateway.capture import EpisodeStore
from credo.gateway.chat import (RequestError, check_completion_request, check_request, cut_at_stop, parse_tool_calls,
                                render)
from credo.gateway.streaming import server_sent_events

log = logging.getLogger("credo.gateway")


def call_seeds(seed: int | None, episode: str, index: int, n: int) -> list[int]:
    """Per-choice seeds: from the request's `seed`, else a function of (episode, call index), so a replayed
    episode draws the same answers."""
    if seed is not None:
        return [(seed + i) % 2**63 for i in range(n)]
    digest = hashlib.sha256(f"{episode}\x00{index}".encode()).digest()
    base = int.from_bytes(digest[:7], "little")
    return [base + i for i in range(n)]


class ChatService:
    """The endpoint's logic without HTTP: checked request in, OpenAI response dict out (or RequestError)."""

    def __init__(self, sample: SampleFn, tokenizer, *, model_name: str, store: EpisodeStore, max_tokens: int = 256,
                 max_context: int | None = None, sampling: dict | None = None, concurrent: bool = False,
                 template: str | None = None):
        self.sample, self.tokenizer, self.model_name = sample, tokenizer, model_name
        self.template = template
        """A Jinja chat template rendering every chat request instead of the tokenizer's (None: the tokenizer's)."""
        self.store, self.max_tokens, self.max_context = store, max_tokens, max_context
        self.concurrent = concurrent
        """False: one call plans, samples and records at a time (the store's lock held throughout). True (with a
        batching sampler, credo.gateway.batching): the lock is held to plan and to record only, so calls of
        different episodes sample together; the calls of one episode still run one at a time (its stripe lock)."""
        self._episode_locks = [threading.Lock() for _ in range(256)]
        self.sampling = sampling
        """None, or the run's fixed {'temperature', 'top_p'} (training: the trainer scores the tokens at them). A
        request that omits them is sampled at them; one that sets another value is refused (400), not resampled."""

    def complete(self, body, header_episode: str = "", key_episode: str = "") -> dict:
        """POST /v1/chat/completions."""
        req = self._checked(check_request, body)
        text = render(self.tokenizer, req["messages"], req["tools"], template=self.template)
        episode = header_episode or req["user"] or key_episode or "default"
        record, texts = self._sample_and_record(req, episode, text)
        return self._response(req, record, texts, episode)

    def complete_text(self, body, header_episode: str = "", key_episode: str = "") -> dict:
        """POST /v1/completions: the prompt is the text itself (no template), captured by the same rules."""
        req = self._checked(check_completion_request, body)
        episode = header_episode or req["user"] or key_episode or "default"
        record, texts = self._sample_and_record(req, episode, req["prompt"])
        choices = []
        for i, (choice, text) in enumerate(zip(record.choices, texts)):
            out = {"index": i, "text": text, "finish_reason": choice["finish_reason"], "logprobs": None}
            if req["logprobs"]:
                tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in choice["response_ids"]]
                out["logprobs"] = {"tokens": tokens, "token_logprobs": [float(x) for x in choice["log_probs"]],
                                   "top_logprobs": None, "text_offset": None}
            choices.append(out)
        return {**self._envelope(record, episode, "cmpl", "text_completion"), "choices": choices}

    def _checked(self, check, body) -> dict:
        req = check(body, max_tokens_cap=self.max_tokens)
        for key, value in (self.sampling or {}).items():
            sent = body.get(key)
            if sent is not None and float(sent) != float(value):
                raise RequestError(f"'{key}' = {sent!r}: this gateway samples at {key} = {value} (the run's setting: "
                                   "the trainer scores the sampled tokens at it); omit it or send that value",
                                   param=key)
            req[key] = value
        if req["model"] != self.model_name:
            raise RequestError(f"model {req['model']!r} is not served here (this gateway serves {self.model_name!r})",
                               status=404, code="model_not_found", param="model")
        return req

    def _sample_and_record(self, req: dict, episode: str, text: str):
        """(the call's record, the text returned per choice): plan the prompt ids, sample n, cut at stop, record."""
        if self.concurrent:
            return self._sample_and_record_concurrently(req, episode, text)
        with self.store.lock:  # plan, sample, record: one call at a time, so two calls of an episode never race
            plan, seeds = self._plan(req, episode, text)
            samples = self.sample([plan.prompt_ids] * req["n"], max_new_tokens=req["max_tokens"],
                                  temperature=req["temperature"] or 1.0, top_p=req["top_p"], seeds=seeds)
            choices = [self._choice(s, req["stop"]) for s in samples]
            version = min(s.policy_version for s in samples)
            record = self.store.record(episode, text, plan, [c[0] for c in choices], version)
            self.store.counters["gateway/requests"] += 1
        return record, [c[1] for c in choices]

    def _plan(self, req: dict, episode: str, text: str):
        """(plan, call index, seeds) of a call, under the store's lock."""
        if episode in self.store.closed:
            raise RequestError(f"episode {episode!r} is over (its agent ran past its timeout); this call is not "
                               "sampled", status=409, code="episode_closed")
        plan = self.store.plan(episode, text)
        if self.max_context is not None and len(plan.prompt_ids) + req["max_tokens"] > self.max_context:
            raise RequestError(f"the prompt has {len(plan.prompt_ids)} tokens and max_tokens is "
                               f"{req['max_tokens']}: more than the model's {self.max_context}",
                               code="context_length_exceeded", param="messages" if "messages" in req else "prompt")
        index = len(self.store.calls.get(episode, []))
        seeds = None if req["temperature"] == 0 else call_seeds(req["seed"], episode, index, req["n"])
        return plan, seeds

    def _sample_and_record_concurrently(self, req: dict, episode: str, text: str):
        """As `_sample_and_record`, sampling outside the store's lock (see `concurrent`)."""
        with self._episode_locks[hash(episode) % len(self._episode_locks)]:
            with self.store.lock:
                plan, seeds = self._plan(req, episode, text)
            samples = self.sample([plan.prompt_ids] * req["n"], max_new_tokens=req["max_tokens"],
                                  temperature=req["temperature"] or 1.0, top_p=req["top_p"], seeds=seeds)
            choices = [self._choice(s, req["stop"]) for s in samples]
            with self.store.lock:
                if episode in self.store.closed:  # closed at its timeout while this call sampled: not recorded
                    raise RequestError(f"episode {episode!r} is over (its agent ran past its timeout); this call is "
                                       "not recorded", status=409, code="episode_closed")
                version = min(s.policy_version for s in samples)
                record = self.store.record(episode, text, plan, [c[0] for c in choices], version)
                self.store.counters["gateway/requests"] += 1
        return record, [c[1] for c in choices]

    def _choice(self, s, stop: list[str]) -> tuple[dict, str]:
        """(the recorded choice, the text returned) of one sample, cut at the first stop string."""
        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        ids, logps, cut_text = cut_at_stop(list(s.response_ids), list(s.rollout_log_probs), stop, decode)
        finish = "stop" if cut_text is not None or s.finished else "length"
        text = decode(ids) if cut_text is None else cut_text
        return {"response_ids": ids, "log_probs": logps, "finish_reason": finish}, text

    def _response(self, req: dict, record, texts: list[str], episode: str) -> dict:
        choices = []
        for i, (choice, text) in enumerate(zip(record.choices, texts)):
            content, calls = parse_tool_calls(text, f"call-{episode}-{record.index}-{i}")
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = calls
            finish = "tool_calls" if calls and choice["finish_reason"] == "stop" else choice["finish_reason"]
            out = {"index": i, "message": message, "finish_reason": finish, "logprobs": None}
            if req["logprobs"]:
                out["logprobs"] = {"content": [self._token_logprob(t, lp) for t, lp in
                                               zip(choice["response_ids"], choice["log_probs"])]}
            choices.append(out)
        return {**self._envelope(record, episode, "chatcmpl", "chat.completion"), "choices": choices}

    def _envelope(self, record, episode: str, prefix: str, kind: str) -> dict:
        completion = sum(len(c["response_ids"]) for c in record.choices)
        return {"id": f"{prefix}-{secrets.token_hex(8)}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "system_fingerprint": f"credo-v{record.policy_version}",
                "usage": {"prompt_tokens": len(record.prompt_ids), "completion_tokens": completion,
                          "total_tokens": len(record.prompt_ids) + completion},
                "credo": {"episode": episode, "call": record.index, "policy_version": record.policy_version,
                          "prompt_kind": record.kind}}

    def _token_logprob(self, token_id: int, logprob: float) -> dict:
        token = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": float(logprob), "bytes": list(token.encode()), "top_logprobs": []}


REWARD_KEYS = {"reward", "call", "user"}


def report_reward(store: EpisodeStore, body, header_episode: str = "", key_episode: str = "") -> dict:
    """POST /credo/reward: a per-turn reward, `{"reward": float, "call": int (optional: the episode's latest call)}`,
    added to that call's turn (credo.gateway.rewards). The episode is found as for a completion call."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - REWARD_KEYS)
    if unknown:
        raise RequestError(f"unsupported key(s) in a reward report: {', '.join(unknown)} (expected reward, call)",
                           param=unknown[0])
    value, call = body.get("reward"), body.get("call")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"'reward' must be a finite number, got {value!r}", param="reward")
    if call is not None and (isinstance(call, bool) or not isinstance(call, int)):
        raise RequestError(f"'call' must be an integer (the 'credo.call' of the answer it rewards), got {call!r}",
                           param="call")
    user = body.get("user") if isinstance(body.get("user"), str) else ""
    episode = header_episode or user or key_episode or "default"
    try:
        index = store.add_call_reward(episode, float(value), call)
    except ValueError as e:
        status = 409 if episode in store.closed else 400
        raise RequestError(str(e), status=status, code="episode_closed" if status == 409 else "invalid_request_error",
                           param="call") from None
    return {"episode": episode, "call": index, "reward": float(value)}


def episode_in_key(api_key: str, presented: str) -> str:
    """The episode a key names (`<run key>:<episode>`); '' for the run's key itself."""
    return presented[len(api_key) + 1:] if presented.startswith(api_key + ":") else ""


def key_ok(api_key: str, presented: str) -> bool:
    """The run's key itself, or `<run key>:<episode>`; compared in constant time."""
    run_part = presented.split(":", 1)[0] if ":" in presented else presented
    return hmac.compare_digest(run_part.encode(), api_key.encode())


def build_app(service: ChatService, api_key: str):
    """The FastAPI app: /v1/chat/completions, /v1/completions and /v1/models, all behind the key."""
    app = FastAPI(title="credo gateway", docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
        service.store.count("gateway/errors")
        log.warning("gateway refused a request (HTTP %d, %s): %s", status, code, message)
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": code, "code": code,
                                                                   "param": param}})

    def presented_key(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        return key if key and key_ok(api_key, key) else None

    @app.get("/v1/models")
    async def models(request: Request):
        if presented_key(request) is None:
            return refuse(401, "missing or wrong API key (Authorization: Bearer <the run's key>)", "invalid_api_key")
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "owned_by": "credo"}]}

    async def authorised_body(request: Request):
        """(the key presented, the JSON body), or the refusal to answer with (401 without the run's key, 400)."""
        key = presented_key(request)
        if key is None:
            return None, refuse(401, "missing or wrong API key (Authorization: Bearer <the run's key>)",
                                "invalid_api_key")
        try:
            return key, await request.json()
        except ValueError:
            return None, refuse(400, "the request body is not JSON", "invalid_request_error")

    async def serve(request: Request, handler):
        key, body = await authorised_body(request)
        if key is None:
            return body
        try:
            response = await run_in_threadpool(handler, body, request.headers.get("x-episode-id", ""),
                                               episode_in_key(api_key, key))
            if body.get("stream") is True:  # checked by the handler: a bool, stream_options a known mapping
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(server_sent_events(response, include_usage), media_type="text/event-stream")
            return response
        except RequestError as e:
            return refuse(e.status, str(e), e.code, e.param)
        except Exception as e:  # noqa: BLE001 - a backend failure is one call's 500, not the server's end
            log.exception("gateway: sampling failed")
            return refuse(500, f"sampling failed: {type(e).__name__}: {e}", "server_error")

    @app.post("/credo/reward")
    async def reward(request: Request):
        key, body = await authorised_body(request)
        if key is None:
            return body
        try:
            return report_reward(service.store, body, request.headers.get("x-episode-id", ""),
                                 episode_in_key(api_key, key))
        except RequestError as e:
            return refuse(e.status, str(e), e.code, e.param)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, service.complete)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, service.complete_text)

    return app
