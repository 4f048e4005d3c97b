"""`\\boxed{...}` contents of a model's text: the boxes that judges' verdicts and scores (credo.families.judges.parse)
and skill ratings (credo.families.polymath.judge_skills) are read from.

A box is ``\\boxed{...}`` (whitespace allowed between ``\\boxed`` and ``{``). Its content runs to the matching
``}``: nested groups (``\\boxed{\\frac{1}{2}}``) are part of the content, escaped braces ``\\{``/``\\}`` do not
count, and a box inside another box belongs to the outer one's content. A box whose ``}`` never comes is
*unterminated*. Text inside fenced code blocks (a line starting with three backticks, up to the next such line or the
end of the text) is ignored: a judge quoting a response's code or its ``\\boxed{}`` answer is not giving a verdict.

Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["boxed_contents"]

_TOKENS = re.compile(r"\\boxed\s*\{|\\[{}]|[{}]")
_FENCE = re.compile(r"^[ \t]*```", re.MULTILINE)


def boxed_contents(text: str) -> list[str | None]:
    """Contents of the top-level boxes of ``text`` outside code fences, in order.

    An unterminated box (necessarily the last one) is listed as None. Linear in ``len(text)``.

    Raises:
        TypeError: ``text`` is not a ``str`` (None or bytes are caller bugs, not judge outputs).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = _drop_code_fences(text)
    boxes: list[str | None] = []
    depth = 0
    start = box_depth = None
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token.startswith("\\b"):
            if start is None:
                start, box_depth = match.end(), depth
            depth += 1
        elif token == "{":
            depth += 1
        elif token == "}":
            if depth == 0:
                continue  # a stray closing brace in prose closes nothing
            depth -= 1
            if start is not None and depth == box_depth:
                boxes.append(text[start : match.start()])
                start = None
        # escaped braces \{ \} are literal characters
    if start is not None:
        boxes.append(None)
    return boxes


def _drop_code_fences(text: str) -> str:
    """``text`` without fenced code blocks (an unclosed fence runs to the end, as in Markdown)."""
    if "```" not in text:
        return text
    kept, pos, inside = [], 0, False
    for fence in _FENCE.finditer(text):
        if not inside:
            kept.append(text[pos : fence.start()])
        else:
            pos = text.find("\n", fence.end())
            pos = len(text) if pos < 0 else pos + 1  # the closing fence line goes too
            kept.append("\n")
        inside = not inside
    if not inside:
        kept.append(text[pos:])
    return "".join(kept)
