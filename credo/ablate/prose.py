"""Intervals quoted in a doc's prose, each tied to the comparison it reports and recomputed by `credo report --check`.

A sentence that quotes a difference or a mean with its interval puts a marker right before the number::

    distillation's curve stands higher, <!-- credo:interval docs/results/distill.jsonl compare="distill > grpo"
    metric=eval/accuracy:mean test=paired -->+0.016 [+0.011, +0.020] (paired, Holm p < 0.001)

The rule (docs/reproductions.md, "Intervals in prose"):

- the marker is an HTML comment (invisible on the rendered page) `<!-- credo:interval RESULTS KEY=VALUE ... -->`,
  RESULTS a results .jsonl file or the sweep file that names one (paths relative to the repository root), and the printed interval
  `EST [LOW, HIGH]` follows it directly (only spaces or one line break between);
- `compare="A > B"` (or `A < B`, `A vs B`): the difference A - B of variants A and B, computed as the results
  tables compute it (`credo.ablate.report.compare`: paired by seed when both ran the same seeds from shared
  warm-ups, Welch otherwise); `test=paired` or `test=Welch` is required and must be the test the tables use, and
  the paragraph that holds the number must name it;
- `variant=NAME`: that variant's mean and its t-interval over seeds (the tables' `mean` and `[95% CI]` columns);
- `metric=KEY[:REDUCE[:ARG]]` as `credo report --metric` (default eval/accuracy:final); `sweep=NAME` when the
  results file holds several sweeps;
- `stat=g`: the comparison's effect size and its interval instead of the difference (g_av for a paired design,
  Hedges' g for Welch, as the tables' `effect size` column); the paragraph must name the kind (`g_av` or `g`);
- `unpaired=true`: Welch's difference even where the tables pair the runs (a sentence that restates a paired
  comparison unpaired, on purpose); it needs `test=Welch`, and the paragraph must say Welch;
- every printed number must equal the recomputed one at the precision printed: `+0.001` stands for anything that
  rounds to 0.001 at three decimals, `+0.00154` for anything that rounds to 0.00154 at five.

An interval that is not a comparison of committed raw results (a figure quoted from a paper, a measured spread of
timings, a first run whose per-seed values were not kept) says what it is instead, with a kind and a reason::

    the paper reports <!-- credo:quoted paper: Table 2 of arXiv 2508.08221 -->+0.8 [+0.3, +1.3]

A hand-made table or section of such intervals (a first run's table) is quoted as a whole, between
`<!-- credo:quoted-begin KIND: REASON -->` and `<!-- credo:quoted-end -->`; every interval inside counts as quoted.

`credo report --check` does not recompute a quoted interval, but counts it by kind on the page's line of its
output, so nothing passes silently; a quoted marker with no interval after it, a region with none inside, a region
not closed, or an unknown kind, fails.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from credo.config import ConfigError

MARKER_RE = re.compile(r"<!-- credo:interval (?P<args>.*?) -->", re.S)
NUMBER = r"[-+−]?\d*\.?\d+"
GAP = r"(?:[ \t]+\n?[ \t]*|\n[ \t]*)"
"""The space between an estimate and its bracket, or after the bracket's comma: a line break counts (prose is wrapped)."""
PRINTED_RE = re.compile(rf"\s*(?P<est>{NUMBER}){GAP}\[(?P<low>{NUMBER}),{GAP}(?P<high>{NUMBER})\]")
"""What must follow a credo:interval marker: 'EST [LOW, HIGH]' (only white space before it; a line break allowed)."""
_DEC = r"[-+−]?\d*\.\d+"
INTERVAL_RE = re.compile(
    rf"{_DEC}{GAP}\[{_DEC},{GAP}{_DEC}\]"                                 # '+0.012 [+0.00154, +0.022]' (a table's Δ)
    rf"|\b(?:CI|interval)(?: of)?{GAP}\[{NUMBER}%?,{GAP}{NUMBER}%?\]"       # '2.29x, 95% CI [1.89, 2.78]'
    rf"|{NUMBER}[%x]{GAP}\[{NUMBER}[%x]?,{GAP}{NUMBER}[%x]?\]"           # '95.0% [90.4%, 97.4%]'
    rf"|(?<![\w.])\d+{GAP}\[\d+,{GAP}\d+\]")                             # '3234 [3489, 2980]'
"""What the check calls an interval in prose: an estimate with its bracket, in the forms the docs print."""
FOLLOW_RE = re.compile(rf"\s*(?:{INTERVAL_RE.pattern})")
"""What must follow a credo:quoted marker: any interval the detector sees."""
FENCE_RE = re.compile(r"^```.*?^```", re.M | re.S)  # a marker shown as an example in a code fence is not checked
KEYS = ("compare", "variant", "metric", "test", "sweep", "stat", "unpaired")
QUOTED_RE = re.compile(r"<!-- credo:quoted (?P<kind>[a-z]+): (?P<reason>[^>]*?\S[^>]*?) -->")
QUOTED_ANY_RE = re.compile(r"<!-- credo:quoted(?:\s(?P<args>.*?))?-->", re.S)
REGION_RE = re.compile(r"<!-- credo:quoted-begin (?P<kind>[a-z]+): (?P<reason>[^>]*?\S[^>]*?) -->(?P<body>.*?)"
                       r"(?:<!-- credo:quoted-end -->|\Z)", re.S)
REGION_END = "<!-- credo:quoted-end -->"
QUOTED_KINDS = {
    "paper": "a figure quoted from the paper, not a run of ours",
    "timing": "a measured spread of timings (e.g. median [min, max]), not a confidence interval over seeds",
    "legacy": "a first run whose per-seed values were not kept (docs/results/legacy_summaries.yaml)",
    "setting": "a range of settings or a tolerance, not a result",
    "script": "printed by a named script from committed raw results, in a form credo report does not make (the script "
              "and its own test compute it)",
}
"""What a `credo:quoted` interval may be: kind -> what it means (the check prints the counts per kind)."""


@dataclass
class Marked:
    """One marked interval of a page."""

    spec: str
    """The marker's arguments, as written."""
    line: int
    """The page's line of the marker (1-based)."""
    printed: str
    """The interval as printed after the marker ('' when none follows)."""
    offset: int = -1
    """Where the printed interval starts in the page (-1 when none follows)."""
    problem: str = ""
    """'' when the printed interval is the recomputed one; else what differs."""


def check_page(text: str, cache: dict | None = None) -> list[Marked]:
    """Every marked interval of a page, each with its `problem` ('' when it matches its recomputation).

    Raises:
        ConfigError: a marker that cannot be read (unknown key, no RESULTS file, an unknown variant or metric).
    """
    cache = {} if cache is None else cache
    text = _blank_fences(text)
    out = []
    for m in MARKER_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        printed = PRINTED_RE.match(text, m.end())
        if printed is None:
            out.append(Marked(m["args"], line, "", problem="no 'EST [LOW, HIGH]' follows the marker"))
            continue
        values, test = recompute(m["args"], cache, where=f"line {line}")
        problem = _differs([printed["est"], printed["low"], printed["high"]], values)
        want = _option(m["args"], "test")
        if test is not None and want != test:
            problem = problem or f"the tables' test is {test}, the marker says test={want}"
        words = MARKER_RE.sub("", _paragraph(text, m.start()))
        if test is not None and not problem and test.lower() not in words.lower():
            problem = f"the paragraph does not say the interval is {test}"
        kind = "g_av" if test == "paired" else "g"
        if _option(m["args"], "stat") == "g" and not problem and not re.search(rf"\b{kind}\b", words):
            problem = f"the paragraph does not say the effect size is {kind}"
        out.append(Marked(m["args"], line, printed.group().strip(), offset=printed.start("est"), problem=problem))
    return out


def marked_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each marked interval's printed text, so the verbatim prose check can leave them out."""
    spans = []
    text = _blank_fences(text)
    for m in MARKER_RE.finditer(text):
        printed = PRINTED_RE.match(text, m.end())
        if printed is not None:
            spans.append((printed.start("est"), printed.end()))
    for m in QUOTED_ANY_RE.finditer(text):
        follow = FOLLOW_RE.match(text, m.end())
        if follow is not None:
            spans.append((m.end(), follow.end()))
    return sorted(spans)


def unquoted(text: str) -> str:
    """The text without its marked and quoted intervals (marker and number) and its quoted regions."""
    for start, end in reversed(marked_spans(text)):
        text = text[:start] + text[end:]
    return REGION_RE.sub("", QUOTED_ANY_RE.sub("", MARKER_RE.sub("", text)))


def quoted_intervals(text: str) -> tuple[dict[str, int], list[str]]:
    """The page's `credo:quoted` intervals counted by kind, and the problems (line: what) of those that are wrong.

    Raises:
        ConfigError: a quoted marker with an unknown kind or no reason, naming its line.
    """
    text = _blank_fences(text)
    counts: dict[str, int] = {}
    problems = []
    for r in REGION_RE.finditer(text):
        line = text.count("\n", 0, r.start()) + 1
        if r["kind"] not in QUOTED_KINDS:
            raise ConfigError(f"credo:quoted-begin at line {line}: unknown kind '{r['kind']}' (one of "
                              f"{', '.join(QUOTED_KINDS)})")
        n = len(INTERVAL_RE.findall(unquoted(r["body"])))
        if not r[0].endswith(REGION_END):
            problems.append(f"{line}: credo:quoted-begin {r['kind']}: no '{REGION_END}' closes it")
        elif n == 0:
            problems.append(f"{line}: credo:quoted-begin {r['kind']}: no interval inside the region")
        counts[r["kind"]] = counts.get(r["kind"], 0) + n
    for m in QUOTED_ANY_RE.finditer(text):
        if m.group().startswith(("<!-- credo:quoted-begin", "<!-- credo:quoted-end")):
            continue
        line = text.count("\n", 0, m.start()) + 1
        q = QUOTED_RE.fullmatch(m.group())
        if q is None or q["kind"] not in QUOTED_KINDS:
            raise ConfigError(f"credo:quoted at line {line}: expected '<!-- credo:quoted KIND: REASON -->' with KIND "
                              f"one of {', '.join(QUOTED_KINDS)} and a reason (got {m.group()!r})")
        if FOLLOW_RE.match(text, m.end()) is None:
            problems.append(f"{line}: credo:quoted {q['kind']}: no interval follows the marker")
            continue
        counts[q["kind"]] = counts.get(q["kind"], 0) + 1
    return counts, problems


def recompute(spec: str, cache: dict, where: str = "") -> tuple[tuple[float, float, float], str | None]:
    """(estimate, low, high) and the test ('paired'/'Welch'; None for a variant's mean) a marker names."""
    from credo.ablate.report import _variant_result, compare
    from credo.ablate.report_cli import parse_metric

    source, opts = _parse(spec, where)
    records = _records(source, opts.get("sweep"), cache, where)
    metric = parse_metric(opts.get("metric", "eval/accuracy:final"))
    variants = list(dict.fromkeys(r["variant"] for r in records))

    def result(name: str):
        if name not in variants:
            raise ConfigError(f"credo:interval at {where}: '{name}' names no variant of {source} "
                              f"(variants: {', '.join(variants)})")
        return _variant_result(name, [r for r in records if r["variant"] == name], [metric])

    if "variant" in opts:
        s = result(opts["variant"]).stats[metric.label]
        return (s.mean, s.low, s.high), None
    from credo.ablate.spec import parse_comparison

    try:
        c = parse_comparison(opts["compare"], variants, f"credo:interval at {where}: compare")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    a, b = result(c.a), result(c.b)
    if opts.get("unpaired") == "true":
        return _welch(a, b, metric.label, opts.get("stat") == "g")
    r = compare(a, b, metric.label, c.expect)
    if opts.get("stat") == "g":
        return (r.g.g, r.g.low, r.g.high), r.test
    return (r.diff, r.low, r.high), r.test


def _welch(a, b, label: str, effect: bool) -> tuple[tuple[float, float, float], str]:
    """a - b (or Hedges' g) by Welch's test on the two variants' values, whatever the tables' design."""
    from credo.ablate.report import CONFIDENCE
    from credo.ablate.stats import hedges_g, welch_diff

    xs, ys = list(a.values[label].values()), list(b.values[label].values())
    if effect:
        g = hedges_g(xs, ys, CONFIDENCE)
        return (g.g, g.low, g.high), "Welch"
    r = welch_diff(xs, ys, CONFIDENCE)
    return (r.diff, r.low, r.high), "Welch"


def _blank_fences(text: str) -> str:
    """The page with its code fences blanked (a marker shown there as an example is not checked), its offsets and
    line numbers kept."""
    return FENCE_RE.sub(lambda f: re.sub(r"[^\n]", " ", f.group()), text)


def _parse(spec: str, where: str) -> tuple[str, dict[str, str]]:
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise ConfigError(f"credo:interval at {where}: {e}") from None
    source = [w for w in words if "=" not in w]
    opts = dict(w.split("=", 1) for w in words if "=" in w)
    unknown = sorted(set(opts) - set(KEYS))
    if len(source) != 1 or unknown:
        raise ConfigError(f"credo:interval at {where}: expected one RESULTS file and keys among {', '.join(KEYS)} "
                          f"(got files {source}, unknown keys {unknown})")
    if ("compare" in opts) == ("variant" in opts):
        raise ConfigError(f"credo:interval at {where}: give compare=\"A > B\" or variant=NAME (one of them)")
    if "compare" in opts and opts.get("test") not in ("paired", "Welch"):
        raise ConfigError(f"credo:interval at {where}: compare needs test=paired or test=Welch (the label the prose prints)")
    if opts.get("stat", "diff") not in ("diff", "g") or ("stat" in opts and "compare" not in opts):
        raise ConfigError(f"credo:interval at {where}: stat=g (the effect size) goes with compare=; got stat={opts.get('stat')}")
    if "unpaired" in opts and (opts["unpaired"] != "true" or "compare" not in opts or opts.get("test") != "Welch"):
        raise ConfigError(f"credo:interval at {where}: unpaired=true goes with compare= and test=Welch")
    return source[0], opts


def _option(spec: str, key: str) -> str | None:
    return _parse(spec, "")[1].get(key)


def _records(source: str, sweep: str | None, cache: dict, where: str) -> list[dict]:
    from credo.ablate.results import read_results

    if source.endswith((".yaml", ".yml")):  # a sweep file: its results file and its sweep's name
        from credo.ablate.spec import load_sweep

        spec = load_sweep(Path(source))
        source, sweep = str(spec.results), sweep or spec.name
    if source not in cache:
        if not Path(source).is_file():
            raise ConfigError(f"credo:interval at {where}: results file not found: '{source}'")
        cache[source] = read_results(source)
    records = cache[source]
    names = list(dict.fromkeys(r["sweep"] for r in records))
    name = sweep or (names[0] if len(names) == 1 else None)
    if name not in names:
        raise ConfigError(f"credo:interval at {where}: '{source}' holds sweeps {', '.join(names)}; name one with sweep=")
    return [r for r in records if r["sweep"] == name]


def _differs(printed: list[str], values: tuple[float, float, float]) -> str:
    """'' when each printed number is its value at the printed precision; else both, side by side."""
    from credo.ablate.tables import fmt, interval

    for text, x in zip(printed, values):
        v = float(text.replace("−", "-"))
        digits = len(text.split(".")[1]) if "." in text else 0
        if math.isnan(x) or abs(x - v) > 0.5 * 10 ** -digits + 1e-12:
            return (f"printed {printed[0]} [{printed[1]}, {printed[2]}], recomputed "
                    f"{fmt(values[0], sign=True)} {interval(values[1], values[2], sign=True)}")
    return ""


def _paragraph(text: str, pos: int) -> str:
    """The paragraph (or list item) around `pos`: from the blank line before to the blank line after."""
    start = text.rfind("\n\n", 0, pos)
    end = text.find("\n\n", pos)
    return text[start + 1 if start >= 0 else 0: end if end >= 0 else len(text)]
