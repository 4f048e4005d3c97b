"""The shop's four tools and their call format: GEM's tool tags, short enough for a tiny char-level model.

GEM's tools are each called with their own tag (`<search>query</search>` is gem.tools.search_tool.SearchTool's
call, `<python>code</python>` PythonCodeTool's) and a final answer goes in `\\boxed{}` (every GEM game); GEM's
MCP tool takes `<tool_call><tool_name>NAME</tool_name><arguments>{JSON}</arguments></tool_call>`. The shop
accepts both, and the first call in a turn's text counts (text around it is free, as in GEM):

    <search>shoe red wool size=m <=60</search>   search(query, filters): words ranked by BM25, filter tokens
                                                  `field=word`, `<=N` / `$<=N` (max price), `>=N` (min price)
    <view>17</view>                               view(product_id): every attribute of product 17
    <ask>what size?</ask>                         ask_user(question): the user's answer about one attribute
    \\boxed{17}   (or <buy>17</buy>)              buy(product_id): ends the episode
    <tool_call><tool_name>search</tool_name><arguments>{"query": "shoe red", "filters": {"size": "m",
        "max_price": 60}}</arguments></tool_call>  (tools: search, view, ask_user, buy; view/buy take
                                                  {"product_id": 17}, ask_user {"question": "..."})

`parse_tool_call(text)` returns a `ToolCall` or the reason it is invalid (the env's observation `invalid: <reason>`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES

TAGS = re.compile(r"<(search|view|ask|buy)>(.*?)</\1>|\\boxed\{([^{}]*)\}|"
                  r"<tool_call>\s*<tool_name>([^<]+)</tool_name>\s*<arguments>(.*?)</arguments>\s*</tool_call>",
                  re.DOTALL)
NAMES = {"search": "search", "view": "view", "ask": "ask_user", "ask_user": "ask_user", "buy": "buy"}
FILTER_KEYS = ATTRIBUTES + ("max_price", "min_price", "min_rating")
FILTER_TOKEN = re.compile(r"^(?:(\w+)=(\S+)|\$?(<=|>=)\$?(\d+))$")
INTEGER = re.compile(r"\d+")


@dataclass
class ToolCall:
    name: str
    """search, view, ask_user or buy."""
    query: str = ""
    """search: the free-text words."""
    filters: dict = field(default_factory=dict)
    """search: field -> word, max_price / min_price / min_rating -> number."""
    product: int = -1
    """view, buy: the product id."""
    question: str = ""
    """ask_user: the question text."""


def _search(text: str) -> ToolCall | str:
    words, filters = [], {}
    for token in text.split():
        m = FILTER_TOKEN.match(token.lower())
        if not m:
            words.append(token)
        elif m.group(1):
            if m.group(1) not in FILTER_KEYS:
                return f"unknown filter {m.group(1)}"
            filters[m.group(1)] = m.group(2)
        else:
            filters["max_price" if m.group(3) == "<=" else "min_price"] = int(m.group(4))
    return _checked_search(" ".join(words), filters)


def _checked_search(query: str, filters: dict) -> ToolCall | str:
    for key, value in filters.items():
        if key not in FILTER_KEYS:
            return f"unknown filter {key}"
        if key in ("max_price", "min_price", "min_rating"):
            try:
                filters[key] = float(value)
            except (TypeError, ValueError):
                return f"filter {key} needs a number"
    if not query.strip() and not filters:
        return "empty search"
    return ToolCall("search", query=query, filters=filters)


def _product(name: str, text: str) -> ToolCall | str:
    m = INTEGER.search(text)
    return ToolCall(name, product=int(m.group())) if m else f"{name} needs a product id"


def _mcp(name: str, arguments: str) -> ToolCall | str:
    name = NAMES.get(name.strip())
    if name is None:
        return "unknown tool"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "arguments are not JSON"
    if not isinstance(args, dict):
        return "arguments are not a JSON object"
    if name == "search":
        filters = args.get("filters") or {}
        if not isinstance(filters, dict):
            return "filters are not a JSON object"
        return _checked_search(str(args.get("query", "")), dict(filters))
    if name == "ask_user":
        return ToolCall(name, question=str(args.get("question", "")))
    return _product(name, str(args.get("product_id", "")))


def parse_tool_call(text: str) -> ToolCall | str:
    """The first tool call in `text` (see the module docstring), or why there is none that is valid."""
    m = TAGS.search(text)
    if m is None:
        return "no tool call"
    tag, body, boxed, mcp_name, mcp_args = m.groups()
    if mcp_name is not None:
        return _mcp(mcp_name, mcp_args)
    if boxed is not None:
        return _product("buy", boxed)
    name = NAMES[tag]
    if name == "search":
        return _search(body)
    if name == "ask_user":
        return ToolCall(name, question=body)
    return _product(name, body)
