"""`stream: true` for the gateway's two endpoints: the answer as OpenAI's server-sent events.

The gateway samples a call whole (capture records it whole, under the episode, before anything is sent), then sends
the answer as the chunks an OpenAI-compatible client parses: per choice a role chunk, a content chunk (with the
sampled tokens' log-probs when asked), one chunk per tool call, and a chunk with the finish reason; with
`stream_options: {include_usage: true}` a last chunk with the usage and no choices; then `data: [DONE]`. So an agent
written for a streaming API runs unchanged, and its trajectory is the same as without streaming. What it does not
give is an early first token: nothing is sent before the sampling ends.
"""

from __future__ import annotations

import json
from typing import Iterator


def chat_chunks(response: dict, include_usage: bool) -> Iterator[dict]:
    """The `chat.completion.chunk` objects of one `chat.completion` response, in the order OpenAI sends them."""
    base = _base(response, "chat.completion.chunk", include_usage)
    for c in response["choices"]:
        i, message, logprobs = c["index"], c["message"], c["logprobs"]

        def chunk(delta: dict, finish=None, lp=None) -> dict:
            return {**base, "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk({"content": message["content"]}, lp=logprobs)
            logprobs = None  # sent once, with the first chunk that carries the answer
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk({"tool_calls": [{"index": k, **call}]}, lp=logprobs)
            logprobs = None
        yield chunk({}, finish=c["finish_reason"], lp=logprobs)
    if include_usage:
        yield {**base, "choices": [], "usage": response["usage"]}


def completion_chunks(response: dict, include_usage: bool) -> Iterator[dict]:
    """The streamed `text_completion` objects of one /v1/completions response: one per choice, then the usage."""
    base = _base(response, "text_completion", include_usage)
    for c in response["choices"]:
        yield {**base, "choices": [c]}
    if include_usage:
        yield {**base, "choices": [], "usage": response["usage"]}


def _base(response: dict, kind: str, include_usage: bool) -> dict:
    base = {k: response[k] for k in ("id", "created", "model", "system_fingerprint", "credo")}
    base["object"] = kind
    if include_usage:  # OpenAI: null in every chunk but the last
        base["usage"] = None
    return base


def server_sent_events(response: dict, include_usage: bool) -> Iterator[str]:
    """`data: <chunk>` events of a finished response, then `data: [DONE]`."""
    chunks = chat_chunks if response["object"] == "chat.completion" else completion_chunks
    for chunk in chunks(response, include_usage):
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
