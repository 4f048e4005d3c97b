"""Policy-written text in a judge prompt: its delimiters, the rule that defuses it, the verdict format.

A judge prompt frames each untrusted field (the policy's response, CE-RM's generated criteria) between
delimiters the judge is told about (``[Response]`` ... ``[End of Response]`` in the long templates, ``?``
after the response in the compact ones). A policy that writes a delimiter itself could close the frame
early and put a verdict or an instruction where the judge reads the template's own words; a policy that
writes the verdict format (``\\boxed{10}``) could have it parsed as the verdict if the judge quotes it.
So, before an untrusted text is put in a prompt, :func:`defuse` applies this rule (docs/judges.md,
"Prompt injection and verdict spoofing"):

1. Every *delimiter look-alike* is deleted: the delimiter's non-space characters in order, in any case,
   with any whitespace between them (``[End of Response]``, ``[end  of response]``, ``[ End of Response ]``).
   Deletion repeats until none is left, so pieces cannot join into a new one
   (``[End of [End of Response]Response]``).
2. Then every backslash run directly before ``boxed`` (any case) is deleted: ``\\boxed{10}`` becomes
   ``boxed{10}``. The judge still reads the content, but no parser reads it as a box, so a judge that
   echoes the text cannot hand its verdict to the parser. The same for P-GenRM's JSON key:
   ``"better_response"`` loses its quotes.

The template's delimiters (:func:`template_delimiters`) are its ``[...]`` tags, plus, next to each
untrusted field and the question, the first non-blank line of the template text after it and the last
non-blank line before it when that line is short (``?`` after ``{response}`` in ``{question}{response}?``;
``A:`` and ``B:`` in the compact pairwise form); a line of prose is not a delimiter.
"""

from __future__ import annotations

import functools
import re

__all__ = ["UNTRUSTED_FIELDS", "template_delimiters", "defuse", "contains_verdict"]

UNTRUSTED_FIELDS = frozenset({"response", "response_a", "response_b", "criteria"})
"""Template fields holding model-written text (the question comes from the task, which the recipe trusts)."""

_FIELD = re.compile(r"\{([a-z_]+)\}")
_TAG = re.compile(r"\[[^\[\]\n{}]{1,40}\]")
_BOX_ESCAPE = re.compile(r"\\+(?=boxed)", re.IGNORECASE)
_JSON_KEY = re.compile(r"\"(better_response)\"", re.IGNORECASE)


@functools.lru_cache(maxsize=64)
def template_delimiters(template: str) -> tuple[str, ...]:
    """The delimiters of `template`, longest first (see the module docstring)."""
    found = set(_TAG.findall(template))
    pieces = _FIELD.split(template)  # literal, field, literal, field, ..., literal
    literals, fields = pieces[0::2], pieces[1::2]
    for i, name in enumerate(fields):  # the literal before field i and the one after it
        if name not in UNTRUSTED_FIELDS and name != "question":
            continue  # the text around {lo} and {hi} is prose ("from {lo} to {hi}")
        before = [line.strip() for line in literals[i].splitlines() if line.strip()]
        after = [line.strip() for line in literals[i + 1].splitlines() if line.strip()]
        if before:
            found.add(_short(before[-1], last=True))
        if after:
            found.add(_short(after[0], last=False))
    found.discard("")
    return tuple(sorted(found, key=lambda d: (-len(d), d)))


def _short(line: str, last: bool) -> str:
    """A long prose line next to a field frames it by its nearest word(s): its tag if it has one, else the
    line itself when short (``?``, ``A:``), else nothing (a sentence is not a delimiter)."""
    tags = _TAG.findall(line)
    if tags:
        return tags[-1] if last else tags[0]
    return line if len(line) <= 12 else ""


@functools.lru_cache(maxsize=256)
def _pattern(delimiter: str) -> re.Pattern:
    chars = [c for c in delimiter if not c.isspace()]
    return re.compile(r"\s*".join(re.escape(c) for c in chars), re.IGNORECASE)


def defuse(text: str, delimiters: tuple[str, ...] = ()) -> str:
    """`text` with every delimiter look-alike deleted (repeatedly), then the verdict format defused."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    patterns = [_pattern(d) for d in delimiters if d.strip()]
    while True:
        before = text
        for p in patterns:
            text = p.sub("", text)
        if text == before:
            break
    text = _BOX_ESCAPE.sub("", text)
    return _JSON_KEY.sub(r"\1", text)


def contains_verdict(text: str, mode: str, lo: float = 0, hi: float = 10) -> bool:
    """True when some box of `text` would parse as a verdict of a `mode` judge (pointwise: a score in
    [lo, hi]; pairwise: A or B), wherever it stands: the verdict format in a policy's answer."""
    from credo.families.judges.parse import boxed_contents, parse_pairwise_verdict, parse_pointwise_score

    for content in boxed_contents(text):
        if content is None:
            continue
        box = f"\\boxed{{{content}}}"
        if (parse_pointwise_score(box, lo, hi) if mode == "pointwise" else parse_pairwise_verdict(box)) is not None:
            return True
    return False
