"""Chat requests in and chat answers out: validation, the chat template, tool-call parsing and stop strings.

Everything here is text and token bookkeeping, with no HTTP and no model, so the capture rules
(credo.gateway.capture) and the server (credo.gateway.server) share one definition of what a rendered
conversation is.

- `check_request(body)` validates an OpenAI chat-completions body and raises `RequestError` (HTTP 400, naming
  the key at fault) before anything is sampled.
- `render(tokenizer, messages, tools, template=None)` is the prompt text the model is asked to continue: `template`
  when given (a run's `agent.chat_template`, as vLLM's `--chat-template`), else the tokenizer's own chat template,
  or `DEFAULT_TEMPLATE` (ChatML with the tokenizer's EOS as end of turn and Hermes-style
  `<tool_call>{...}</tool_call>`) when the tokenizer has none (the built-in tiny model's).
- `parse_tool_calls(text)` turns `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` spans of a sampled
  answer into OpenAI `tool_calls`; the arguments string is `json.dumps` of the parsed arguments, which is what
  the default template writes back, so an honest client that echoes the answer re-renders the sampled text.
- `cut_at_stop(...)` shortens a sampled answer at the first stop string, to a token boundary (see its docstring).
"""

from __future__ import annotations

import json
import re
from typing import Any

DEFAULT_TEMPLATE = (
    "{%- if tools %}<|im_start|>tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{{ eos_token }}\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {% if tc.function.arguments is string %}{{ tc.function.arguments }}"
    "{% else %}{{ tc.function.arguments | tojson }}{% endif %}}</tool_call>{% endfor %}{% endif %}"
    "{{ eos_token }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML with the tokenizer's EOS closing each turn and Hermes tool calls; used when the tokenizer has no template."""

ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING_KEYS = {"model", "messages", "tools", "tool_choice", "n", "temperature", "top_p", "max_tokens",
                 "max_completion_tokens", "stop", "logprobs", "top_logprobs", "seed", "user", "stream",
                 "stream_options", "parallel_tool_calls", "frequency_penalty", "presence_penalty", "metadata", "store"}
"""The body keys the chat endpoint reads or accepts; any other key is a 400 naming it (a typo is not sampled around)."""
COMPLETION_KEYS = {"model", "prompt", "n", "temperature", "top_p", "max_tokens", "stop", "logprobs", "seed", "user",
                   "stream", "stream_options", "echo", "suffix", "best_of", "frequency_penalty", "presence_penalty"}
"""The same for /v1/completions."""

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class RequestError(ValueError):
    """A request the gateway refuses: `status` is the HTTP status, `code` OpenAI's error code."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def _text(content: Any, where: str) -> str | None:
    """A message's content as one string: a string, null, or a list of {"type": "text", "text": ...} parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content[{i}]: only text parts ({{'type': 'text', 'text': ...}}) are "
                                   f"supported, got {str(part)[:80]}", param=f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string, null or a list of text parts, got {type(content).__name__}",
                       param=f"{where}.content")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list, got {type(calls).__name__}",
                           param=f"{where}.tool_calls")
    out = []
    for j, tc in enumerate(calls):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise RequestError(f"{where}.tool_calls[{j}] must be {{'id', 'type': 'function', 'function': "
                               f"{{'name': str, 'arguments': str}}}}", param=f"{where}.tool_calls")
        out.append({"id": str(tc.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out


def check_messages(messages: Any) -> list[dict]:
    """The messages normalized (content as a string, tool calls as OpenAI dicts); RequestError names the bad one."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {'role', 'content'} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object, got {type(m).__name__}", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
        msg: dict = {"role": role, "content": _text(m.get("content"), where)}
        if m.get("tool_calls"):
            if role != "assistant":
                raise RequestError(f"{where}: only assistant messages carry tool_calls (role is {role!r})",
                                   param=f"{where}.tool_calls")
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise RequestError(f"{where}: a tool message needs 'tool_call_id' (a string)",
                                   param=f"{where}.tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        if msg["content"] is None and not msg.get("tool_calls"):
            raise RequestError(f"{where} has no content", param=f"{where}.content")
        out.append(msg)
    return out


def _number(body: dict, key: str, default, lo: float, hi: float, kind=float):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise RequestError(f"'{key}' must be a {kind.__name__}, got {v!r}", param=key)
    if not lo <= v <= hi:
        raise RequestError(f"'{key}' must be in [{lo}, {hi}], got {v!r}", param=key)
    return kind(v)


def _sampling(body: Any, keys: set[str], max_tokens_cap: int) -> dict:
    """The settings both endpoints share, checked: unknown keys and penalties refused, numbers in range."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - keys)
    if unknown:
        raise RequestError(f"unsupported request key(s): {', '.join(unknown)}", param=unknown[0])
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {stream!r}", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise RequestError("'stream_options' is only allowed with 'stream': true", param="stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise RequestError(f"'stream_options' must be {{'include_usage': true|false}}, got {options!r}",
                               param="stream_options")
    for key in ("frequency_penalty", "presence_penalty", "top_logprobs"):
        if body.get(key):  # accepted only at their no-op value: sampling without them silently is a wrong answer
            raise RequestError(f"'{key}' is not supported yet (got {body[key]!r}; only 0 or absent)", param=key)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise RequestError("'stop' must be a non-empty string or a list of them", param="stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "model": body.get("model"),
        "n": _number(body, "n", 1, 1, 64, int),
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 1e-9, 1.0),
        "max_tokens": max_tokens_cap if max_tokens is None else _number(
            {"max_tokens": max_tokens}, "max_tokens", max_tokens_cap, 1, max_tokens_cap, int),
        "stop": stop or [],
        "seed": _number(body, "seed", None, -2**63, 2**63 - 1, int),
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
        "stream": bool(stream),
        "include_usage": bool((options or {}).get("include_usage")),
    }


def check_request(body: Any, *, max_tokens_cap: int) -> dict:
    """An OpenAI chat-completions body checked and normalized into the settings the gateway samples with."""
    req = _sampling(body, SAMPLING_KEYS, max_tokens_cap)
    if body.get("tool_choice") not in (None, "auto"):
        raise RequestError(f"'tool_choice' {body['tool_choice']!r} is not supported yet (only 'auto')",
                           param="tool_choice")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool objects", param="tools")
    return {**req, "messages": check_messages(body.get("messages")), "tools": tools or None,
            "logprobs": bool(body.get("logprobs"))}


def check_completion_request(body: Any, *, max_tokens_cap: int) -> dict:
    """An OpenAI (legacy) completions body: `prompt` one string, `logprobs` absent or 0 (the sampled tokens' own
    log-probs; no top alternatives), no `echo`, `suffix` or `best_of`."""
    req = _sampling(body, COMPLETION_KEYS, max_tokens_cap)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be one non-empty string (lists and token ids are not supported yet)",
                           param="prompt")
    for key in ("echo", "suffix", "best_of"):
        if body.get(key) not in (None, False) and not (key == "best_of" and body[key] == req["n"]):
            raise RequestError(f"'{key}' is not supported yet (got {body[key]!r})", param=key)
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0) or isinstance(logprobs, bool):
        raise RequestError(f"'logprobs' must be absent or 0 (top alternatives are not supported yet), got {logprobs!r}",
                           param="logprobs")
    return {**req, "prompt": prompt, "logprobs": logprobs == 0}


def render(tokenizer, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool = True,
           template: str | None = None) -> str:
    """The prompt text of `messages` (and `tools`), ending with the assistant's generation prompt (without it when
    `generation_prompt` is False: a whole conversation, as a warm-up demonstration). `template`: a Jinja chat template
    used instead of the tokenizer's (None: the tokenizer's, or DEFAULT_TEMPLATE when it has none)."""
    if template is None:
        template = None if getattr(tokenizer, "chat_template", None) else DEFAULT_TEMPLATE
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001 - a template raises whatever jinja raises on messages it cannot render
        raise RequestError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                           param="messages") from e


def parse_tool_calls(text: str, call_id_prefix: str) -> tuple[str, list[dict]]:
    """(content, tool_calls) of a sampled answer. Content is the text before the first well-formed tool call
    (the whole text when there is none); a span whose body is not `{"name": str, "arguments": object}` JSON is
    left in the content, not guessed at."""
    calls, first = [], None
    for m in TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict)):
            continue
        first = m.start() if first is None else first
        calls.append({"id": f"{call_id_prefix}-{len(calls)}", "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"])}})
    return (text if first is None else text[:first]), calls


def cut_at_stop(ids: list[int], logps: list[float], stop: list[str],
                decode) -> tuple[list[int], list[float], str | None]:
    """(ids, log-probs, text) of a sampled answer cut before its first stop string; text is None when no stop
    string occurs (the answer is kept whole), else the text before the stop string (what OpenAI returns).

    The kept tokens are the shortest prefix of the sampled ones whose text reaches the stop string's start: those
    are tokens the model sampled, their behaviour log-probs are unchanged (sampling is left to right), and when a
    token boundary falls at the stop string their text is exactly the content returned, so an echoed history
    re-renders them. Where a token straddles the stop string's start it is kept, and the client's echo then differs
    from it: the capture sees drift (credo.gateway.capture), never a token the model did not sample.
    """
    if not stop:
        return ids, logps, None
    text = decode(ids)
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    if not hits:
        return ids, logps, None
    start = min(hits)
    for k in range(len(ids) + 1):
        if len(decode(ids[:k])) >= start:
            return ids[:k], logps[:k], text[:start]
    return ids, logps, text[:start]
