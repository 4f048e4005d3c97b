"""Skill tags: what a problem's reference solution exercises, in one vocabulary shared by every task generator.

Each built-in generator writes `Problem.meta['skills']`: a dict skill -> how many times its reference solution
uses that skill (a tag that is absent is 0). The vocabulary is the same across tasks, so skills can be compared
between disciplines (polymath learning ranks candidate training samples by them, `credo.families.polymath`):

    digit_add     one single-digit addition (a column of a sum; a carry added into a product column)
    digit_sub     one single-digit subtraction (a column of a difference)
    digit_mul     one single-digit product
    carry         a column whose result carries into the next
    carry_chain   a column that takes a carry in and passes one on
    borrow        a column of a difference that borrows from the next
    negative      a negative result
    multi_term    each operand beyond the second
    reverse       a symbol read back to front (digits least significant first; a word spelt backward)
    order         a symbol placed in order (one per symbol of a sorted answer)
    repeat        a symbol that occurs more than once in a sort
    copy          a symbol copied from the prompt to the answer
    scratchpad    a written intermediate step of a worked answer (one per step)

Tasks whose generator does not say what it exercises get `{'rg:<dataset>': 1}` (reasoning-gym) at least.
The counts are computed from the problem itself (the operands, the word), never from a model.
"""

from __future__ import annotations

import re

SKILLS = ("digit_add", "digit_sub", "digit_mul", "carry", "carry_chain", "borrow", "negative", "multi_term",
          "reverse", "order", "repeat", "copy", "scratchpad")
"""The shared vocabulary (reasoning-gym datasets without a mapping add their own 'rg:<dataset>' tag)."""


def _tags(**counts: int) -> dict[str, int]:
    return {k: int(v) for k, v in counts.items() if v}


def column_add_skills(a: int, b: int, digits: int, *, scratchpad: bool = True) -> dict[str, int]:
    """Skills of the column sum a + b of two `digits`-digit numbers, least significant column first."""
    carry = carries = chained = 0
    for i in range(digits):
        s = a // 10 ** i % 10 + b // 10 ** i % 10 + carry
        out = int(s >= 10)
        carries += out
        chained += int(out and carry)
        carry = out
    return _tags(digit_add=digits, carry=carries, carry_chain=chained, reverse=digits if scratchpad else 0,
                 scratchpad=digits if scratchpad else 0)


def column_sub_skills(a: int, b: int) -> dict[str, int]:
    """Skills of |a - b| for a, b >= 0: the larger minus the smaller, column by column, and the sign."""
    hi, lo = max(a, b), min(a, b)
    borrow = borrows = 0
    for i in range(len(str(hi))):
        d = hi // 10 ** i % 10 - lo // 10 ** i % 10 - borrow
        borrow = int(d < 0)
        borrows += borrow
    return _tags(digit_sub=len(str(hi)), borrow=borrows, negative=int(a < b))


def column_mul_skills(a: int, m: int, digits: int) -> dict[str, int]:
    """Skills of the worked product a * m (m one digit): one digit product per column, plus the carry added in."""
    carry = carries = added = 0
    for i in range(digits):
        s = a // 10 ** i % 10 * m + carry
        added += carry > 0
        carry = s // 10
        carries += carry > 0
    return _tags(digit_mul=digits, digit_add=added, carry=carries, reverse=digits, scratchpad=digits)


def sort_skills(letters: str) -> dict[str, int]:
    """Skills of sorting `letters`: every letter placed in order and copied; each letter that repeats."""
    return _tags(order=len(letters), copy=len(letters),
                 repeat=sum(1 for c in set(letters) if letters.count(c) > 1))


def merge_skills(*tags: dict[str, int]) -> dict[str, int]:
    """The sum of several tag dicts (a problem made of parts exercises every part's skills)."""
    out: dict[str, int] = {}
    for t in tags:
        for k, v in t.items():
            out[k] = out.get(k, 0) + v
    return out


_TERM = re.compile(r"([+-])?\s*(\d+)")


def chain_skills(expression: str) -> dict[str, int]:
    """Skills of a left-to-right chain of + and - over integers ('12 + 7 - 30'): each step is a column sum or a
    column difference of magnitudes, whichever its signs make it; `negative` when the result is below 0."""
    terms = [(-1 if sign == "-" else 1) * int(num) for sign, num in _TERM.findall(expression)]
    if not terms:
        return {}
    out: list[dict[str, int]] = [_tags(multi_term=max(0, len(terms) - 2))]
    value = terms[0]
    for t in terms[1:]:
        if (value >= 0) == (t >= 0):  # same signs: the magnitudes add
            n = max(len(str(abs(value))), len(str(abs(t))))
            out.append(column_add_skills(abs(value), abs(t), n, scratchpad=False))
        else:
            out.append({k: v for k, v in column_sub_skills(abs(value), abs(t)).items() if k != "negative"})
        value += t
    out.append(_tags(negative=int(value < 0)))
    return merge_skills(*out)


def rg_skills(dataset: str, entry: dict) -> dict[str, int]:
    """Skills of a reasoning-gym entry: from its generator's metadata where credo maps the dataset, and always the
    dataset's own tag 'rg:<dataset>'."""
    meta = entry.get("metadata") or {}
    own = {f"rg:{dataset}": 1}
    if dataset in ("chain_sum", "basic_arithmetic") and isinstance(meta.get("expression"), str) \
            and set(meta["expression"]) <= set("0123456789+- "):  # sums and differences only
        return merge_skills(own, chain_skills(meta["expression"]))
    if dataset == "spell_backward" and isinstance(meta.get("word"), str):
        n = len(meta["word"])
        return merge_skills(own, _tags(reverse=n, copy=n))
    if dataset in ("number_sorting", "word_sorting", "letter_jumble") and isinstance(entry.get("answer"), str):
        return merge_skills(own, _tags(order=1))
    if dataset == "products" and isinstance(meta.get("expression"), str):
        nums = [int(x) for x in re.findall(r"\d+", meta["expression"])]
        return merge_skills(own, _tags(digit_mul=sum(len(str(x)) for x in nums), multi_term=max(0, len(nums) - 2)))
    return own
