"""Judge-output parsers: a corpus of well-formed and malformed outputs, and property tests."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credo.families.judges.parse import parse_pairwise_verdict, parse_pointwise_score
from credo.rewards.boxed import boxed_contents

LONG_PROSE = "The first response is more careful. " * 20_000  # ~720k characters

PAIRWISE = [
    # (text, expected)
    ("", None),
    ("Response A is better.", None),  # no box
    ("\\boxed{A}", "A"),
    ("\\boxed{B}", "B"),
    ("After weighing both, the better response is \\boxed{B}.", "B"),
    ("\\boxed{ A }", "A"),  # surrounding whitespace
    ("\\boxed{\nB\n}", "B"),
    ("\\boxed {A}", "A"),  # space before the brace
    ("\\boxed{\\text{A}}", "A"),
    ("\\boxed{\\textbf{ B }}", "B"),
    ("\\boxed{\\text{\\textbf{A}}}", "A"),
    ("\\boxed{Response A}", "A"),
    ("\\boxed{response B}", "B"),
    ("\\boxed{\\text{Assistant B}}", "B"),
    ("\\boxed{a}", None),  # lower-case letter: could be a variable
    ("\\boxed{b}", None),
    ("\\boxed{}", None),  # empty box
    ("\\boxed{ }", None),
    ("\\boxed{A} ... on reflection \\boxed{B}", None),  # disagreeing verdicts
    ("\\boxed{A} and again \\boxed{A}", "A"),  # agreeing verdicts
    ("\\boxed{B}\\boxed{B}\\boxed{B}", "B"),
    ("Response A ends with \\boxed{42}; response B with \\boxed{41}. Verdict: \\boxed{A}", "A"),  # math boxes ignored
    ("\\boxed{C}", None),
    ("\\boxed{Tie}", None),
    ("\\boxed{A and B}", None),
    ("\\boxed{AB}", None),
    ("\\boxed{(A)}", None),
    ("\\boxed{A.}", None),
    ("\\boxed{Response C}", None),
    ("\\boxed{A", None),  # unterminated
    ("\\boxed{B} then \\boxed{A", "B"),  # an unterminated box gives no verdict
    ("\\boxed{\\boxed{A}}", None),  # a box in a box is the outer box's content
    ("\\boxed{\\{A\\}}", None),  # escaped braces are content
    ("stray } brace then \\boxed{A}", "A"),
    ("open { brace then \\boxed{B}", "B"),
    ("```\n\\boxed{B}\n```\nMy verdict: \\boxed{A}", "A"),  # boxes inside code fences are quoted material
    ("```latex\n\\boxed{A}\n```", None),
    ("Verdict \\boxed{A}\n```\nunclosed fence \\boxed{B}", "A"),  # an unclosed fence runs to the end
    ("  ```\n\\boxed{B}\n  ```\n\\boxed{B}", "B"),
    ("None", None),
    ("null", None),
    ("\\boxed{None}", None),
    ("\\boxed{A}" + " trailing text" * 100, "A"),
    (LONG_PROSE + "\\boxed{B}", "B"),
    (LONG_PROSE, None),
    ("\\boxed{" * 50_000, None),  # many unterminated opens: linear scan, no verdict
    ("{" * 50_000 + "\\boxed{A}" + "}" * 50_000, "A"),
    ("\\\\boxed{A}", "A"),  # a doubly escaped backslash (JSON-ish) still ends in \boxed{
    ("\\fbox{A}", None),
    ("boxed{A}", None),  # no backslash
    ("\\boxed{Ａ}", None),  # fullwidth letter
]

POINTWISE = [
    # (text, expected) with the default range [0, 10]
    ("", None),
    ("Overall I would give it a 7.", None),  # no box
    ("\\boxed{7}", 7.0),
    ("\\boxed{0}", 0.0),
    ("\\boxed{10}", 10.0),
    ("\\boxed{7.0}", 7.0),
    ("\\boxed{7.5}", 7.5),
    ("\\boxed{7.50}", 7.5),
    ("\\boxed{.5}", 0.5),
    ("\\boxed{7.}", 7.0),
    ("\\boxed{07}", 7.0),
    ("\\boxed{+7}", 7.0),
    ("\\boxed{-0}", 0.0),
    ("\\boxed{ 8 }", 8.0),
    ("\\boxed{\\text{6.5}}", 6.5),
    ("\\boxed {9}", 9.0),
    ("\\boxed{7.3}", None),  # neither an integer nor a half point
    ("\\boxed{7.25}", None),
    ("\\boxed{7.55}", None),
    ("\\boxed{11}", None),  # out of range
    ("\\boxed{10.5}", None),
    ("\\boxed{-1}", None),
    ("\\boxed{-0.5}", None),
    ("\\boxed{nan}", None),
    ("\\boxed{NaN}", None),
    ("\\boxed{inf}", None),
    ("\\boxed{-inf}", None),
    ("\\boxed{1e1}", None),
    ("\\boxed{7e0}", None),
    ("\\boxed{0x7}", None),
    ("\\boxed{7_0}", None),
    ("\\boxed{٧}", None),  # Arabic-Indic seven: float() would accept it
    ("\\boxed{７}", None),  # fullwidth seven
    ("\\boxed{7٫5}", None),
    ("\\boxed{7/10}", None),
    ("\\boxed{7 points}", None),
    ("\\boxed{}", None),
    ("\\boxed{   }", None),
    ("\\boxed{7", None),  # unterminated
    ("\\boxed{4} \\boxed{5} overall \\boxed{8", None),  # last box unterminated: no fallback
    ("\\boxed{\\frac{1}{2}}", None),  # nested braces
    ("\\boxed{{7}}", None),
    ("\\boxed{\\boxed{7}}", None),
    ("Accuracy: \\boxed{4}\nClarity: \\boxed{3}\nOverall: \\boxed{8.5}", 8.5),  # CE-RM layout
    ("Accuracy: \\boxed{4}\nOverall: \\boxed{excellent}", None),  # last box invalid: no fallback to 4
    ("\\boxed{9} but then \\boxed{6}", 6.0),
    ("\\boxed{7}" + " trailing remarks" * 200, 7.0),
    ("\\boxed{7}\n```\n\\boxed{3}\n```", 7.0),  # a box in a code fence is not the last box
    ("```\n\\boxed{3}\n```", None),
    ("None", None),
    ("\\boxed{None}", None),
    ("\\boxed{null}", None),
    ("\\boxed{" + "9" * 400 + "}", None),  # overflows to inf
    ("\\boxed{" + "0" * 5000 + "7}", 7.0),
    (LONG_PROSE + "\\boxed{6}", 6.0),
    ("\\boxed{" * 50_000 + "7", None),
]


@pytest.mark.parametrize("text, expected", PAIRWISE, ids=range(len(PAIRWISE)))
def test_pairwise_corpus(text, expected):
    assert parse_pairwise_verdict(text) == expected


@pytest.mark.parametrize("text, expected", POINTWISE, ids=range(len(POINTWISE)))
def test_pointwise_corpus(text, expected):
    got = parse_pointwise_score(text)
    assert got == expected and (got is None or type(got) is float)


def test_pointwise_custom_range():
    assert parse_pointwise_score("\\boxed{4.5}", lo=0, hi=5) == 4.5
    assert parse_pointwise_score("\\boxed{5.5}", lo=0, hi=5) is None
    assert parse_pointwise_score("\\boxed{0}", lo=1, hi=10) is None
    assert parse_pointwise_score("\\boxed{-2}", lo=-5, hi=5) == -2.0
    with pytest.raises(ValueError, match="^lo is 3 and hi is 1"):
        parse_pointwise_score("\\boxed{2}", lo=3, hi=1)
    with pytest.raises(ValueError, match="^hi is nan"):
        parse_pointwise_score("\\boxed{2}", hi=float("nan"))


def test_non_str_is_a_type_error():
    for bad in (None, b"\\boxed{A}", 7):
        with pytest.raises(TypeError, match="text must be a str"):
            parse_pairwise_verdict(bad)
        with pytest.raises(TypeError, match="text must be a str"):
            parse_pointwise_score(bad)


def test_boxed_contents():
    assert boxed_contents("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}} c \\boxed{y") == ["x^{2}", "\\frac{1}{2}", None]
    assert boxed_contents("\\boxed{\\{1, 2\\}}") == ["\\{1, 2\\}"]
    assert boxed_contents("no boxes {here}") == []


# ---- properties: never raise, value in range ---------------------------------------------------

PIECES = ["\\boxed{", "\\boxed {", "{", "}", "\\{", "\\}", "\\", "A", "B", "a", " ", "\n", "```", "\n```\n",
          "7", "7.5", ".5", "-", "1e1", "nan", "٧", "７", "10", "11", "\\text{", "Response ", "0" * 30]
JUDGE_LIKE = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
ANY_TEXT = st.one_of(st.text(max_size=300), JUDGE_LIKE, st.text(alphabet="\\boxed{}AB7.5 `\n", max_size=200))


@settings(max_examples=300, deadline=None)
@given(text=ANY_TEXT)
def test_pairwise_never_raises(text):
    assert parse_pairwise_verdict(text) in (None, "A", "B")


@settings(max_examples=300, deadline=None)
@given(text=ANY_TEXT, lo=st.sampled_from([0, 1, -3.5]), width=st.sampled_from([0, 5, 10, 0.5]))
def test_pointwise_never_raises_and_stays_in_range(text, lo, width):
    hi = lo + width
    value = parse_pointwise_score(text, lo, hi)
    if value is not None:
        assert type(value) is float and math.isfinite(value)
        assert lo <= value <= hi
        assert (2 * value).is_integer()


PLAIN_PROSE = st.text(alphabet=st.characters(blacklist_characters="\\{}`"), max_size=200)


@settings(max_examples=200, deadline=None)
@given(prefix=PLAIN_PROSE, score=st.integers(0, 24), half=st.booleans())
def test_final_box_after_plain_prose_is_read(prefix, score, half):
    value = score / 2 if half else float(score)
    text = f"{prefix}\nOverall: \\boxed{{{value:g}}}"
    assert parse_pointwise_score(text) == (value if value <= 10 else None)
    assert parse_pairwise_verdict(f"{prefix} \\boxed{{B}}") == "B"


def test_module_imports_without_heavy_packages():
    code = (
        "import sys, credo.families.judges.parse\n"
        "heavy = [m for m in ('transformers', 'vllm', 'deepspeed', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
