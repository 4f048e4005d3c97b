"""Parsers of generative reward-model (judge) outputs: ``\\boxed{...}`` verdicts and scores.

- Pairwise judges (RM-NLHF, arXiv 2601.07349; P-GenRM's pairwise decision, arXiv 2602.12116)
  end with a label ``\\boxed{A}`` or ``\\boxed{B}``: :func:`parse_pairwise_verdict`.
- Pointwise judges (CE-RM, arXiv 2601.20327) score each criterion in a box and finish with an
  overall 0-10 score (integers or half points) in the *last* box: :func:`parse_pointwise_score`.

Standard library only (no transformers/vllm), and total on strings: any ``str`` gives a value or
None, never an exception. The caller decides what a parse failure is worth (CE-RM's evaluation
script scores it 0; an RL reward may rather give a format penalty).

Rules shared by both parsers:

- A box is ``\\boxed{...}`` (whitespace allowed between ``\\boxed`` and ``{``). Its content runs
  to the matching ``}``: nested groups (``\\boxed{\\frac{1}{2}}``) are part of the content,
  escaped braces ``\\{``/``\\}`` do not count, and a box inside another box belongs to the outer
  one's content. A box whose ``}`` never comes is *unterminated*.
- Text inside fenced code blocks (a line starting with ```` ``` ````, up to the next such line
  or the end of the text) is ignored: a judge quoting a response's code or its ``\\boxed{}``
  answer is not giving a verdict.
- Content is stripped of surrounding whitespace and of ``\\text{}``, ``\\textbf{}``,
  ``\\textrm{}``, ``\\mathrm{}``, ``\\mathbf{}`` wrappers (repeatedly).
"""

from __future__ import annotations

import math
import re

from credo.rewards.boxed import boxed_contents

__all__ = ["parse_pairwise_verdict", "parse_pointwise_score"]

_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{(.*)\}", re.DOTALL)
# "A" or "B" in capitals, optionally named as a response/assistant/answer/output. A lower-case
# "a" is refused: inside a quoted solution it is as likely a variable as a verdict.
_VERDICT = re.compile(r"(?:(?i:response|assistant|answer|output)\s*)?([AB])")
# ASCII digits only: Python's float() also reads '٧' or '７', and re's \d matches them.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.([0-9]*))?|\.([0-9]+))")


def parse_pairwise_verdict(text: str) -> str | None:
    """``"A"`` or ``"B"`` from the judge's ``\\boxed{A}`` / ``\\boxed{B}``.

    Accepted box contents (after the shared stripping): ``A``, ``B``, and the letter preceded by
    ``Response``/``Assistant``/``Answer``/``Output`` in any case (``\\boxed{Response A}``,
    ``\\boxed{\\text{A}}``, ``\\boxed{ B }``). The letter itself must be a capital: ``\\boxed{a}``
    does not count. Boxes with other content (a quoted math answer ``\\boxed{42}``, ``(A)``,
    ``A and B``, ``Tie``) and unterminated boxes are ignored.

    Returns:
        The verdict when at least one box holds one and all such boxes agree (repeating the same
        verdict is fine); None when no box holds a verdict or when boxes give both A and B.
    """
    verdicts = set()
    for content in boxed_contents(text):
        if content is None:
            continue
        match = _VERDICT.fullmatch(_unwrap(content))
        if match:
            verdicts.add(match.group(1))
    return verdicts.pop() if len(verdicts) == 1 else None


def parse_pointwise_score(text: str, lo: float = 0, hi: float = 10) -> float | None:
    """The overall score in the *last* ``\\boxed{}`` (CE-RM: per-criterion boxes come first).

    Only the last box is read: if it is unterminated, empty or not a valid score the result is
    None, without falling back to an earlier box (which would be a criterion's 0-5 score).

    A valid score is a plain decimal with ASCII digits, an optional sign and at most a fractional
    part of ``.5`` or ``.0`` (trailing zeros allowed): ``7``, ``7.0``, ``7.5``, ``7.50``, ``.5``,
    ``7.``; not ``7.3``, ``1e1``, ``7/10``, ``nan``, ``inf``, ``٧`` or ``７`` -- and it must lie
    in ``[lo, hi]``.

    Args:
        text: the judge's output.
        lo, hi: inclusive score range (CE-RM: 0 and 10).

    Returns:
        The score as a float (``-0`` as ``0.0``), or None.

    Raises:
        ValueError: ``lo``/``hi`` not finite numbers with ``lo <= hi`` (a caller bug).
        TypeError: ``text`` is not a ``str``.
    """
    for name, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} is {v!r}, expected a finite number")
    if lo > hi:
        raise ValueError(f"lo is {lo!r} and hi is {hi!r}, expected lo <= hi")
    boxes = boxed_contents(text)
    if not boxes or boxes[-1] is None:
        return None
    content = _unwrap(boxes[-1])
    match = _NUMBER.fullmatch(content)
    if match is None:
        return None
    fraction = (match.group(1) or match.group(2) or "").rstrip("0")
    if fraction not in ("", "5"):
        return None
    value = float(content) + 0.0  # ASCII-only by the pattern; + 0.0 turns -0.0 into 0.0
    if not math.isfinite(value) or not lo <= value <= hi:
        return None  # e.g. 400 digits overflow to inf
    return value


def _unwrap(content: str) -> str:
    s = content.strip()
    for _ in range(4):  # \text{\textbf{A}} and the like; a bounded number of layers
        match = _WRAPPER.fullmatch(s)
        if match is None:
            break
        s = match.group(1).strip()
    return s
