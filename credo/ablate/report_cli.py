"""`credo report SWEEP_OR_RESULTS`: a table (markdown) and its curves, remade from a sweep's results file.

    credo report recipes/testbed/separation.yaml               # metrics, baseline, comparisons: the sweep's
    credo report docs/results/x.jsonl --metric eval/accuracy:final --baseline grpo --compare "grpo > reinforce"
    credo report docs/results/x.jsonl --plot docs/img/x.png              # also the curves
    credo report --update docs/reproductions.md                          # rewrite every table block of a doc
    credo report --check docs/reproductions.md                           # exit 1 if a block differs from its command
    credo report --check                                                 # every page under docs/ with a block

A table in a doc is delimited by markers holding its command, so it can be checked and remade::

    <!-- credo report docs/results/x.jsonl --metric eval/accuracy:final --baseline grpo -->
    ...the command's output...
    <!-- /credo report -->

Paths in a block are relative to the working directory (run these from the repository root).

An interval quoted in a sentence is tied to its comparison by a marker right before it,
`<!-- credo:interval docs/results/x.jsonl compare="a > b" metric=eval/accuracy:final test=paired -->+0.016 [...]`,
and `--check` recomputes it from the results file (credo.ablate.prose: the rule, the keys, the precision).
A page that holds the line `<!-- credo report: prose intervals -->` (on a line of its own) (the family pages whose prose quotes a
report) has its other prose intervals checked too: every interval printed outside a block, outside code fences and
without a marker, `-0.117 [-0.171, -0.062]`, must stand verbatim in one of the page's blocks.
An interval that is no comparison of committed results is marked `<!-- credo:quoted KIND: REASON -->` (counted by
kind, not recomputed). A page of first runs whose per-seed values were not kept holds the line
`<!-- credo report: historical intervals -->`: its prose intervals are counted on the check's output as historical,
not recomputed; the mark is refused on a page with a block or a credo:interval marker (its numbers have raw results).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from credo.ablate.prose import GAP, INTERVAL_RE  # noqa: F401 (INTERVAL_RE: what the check calls an interval)
from credo.ablate.spec import REDUCES, Metric, default_label, load_sweep, parse_comparison
from credo.config import ConfigError

PROSE_MARK = "<!-- credo report: prose intervals -->"
HISTORY_MARK = "<!-- credo report: historical intervals -->"
BLOCK_RE = re.compile(r"^<!-- credo report (?P<argv>.*?) -->\n(?P<body>.*?)^<!-- /credo report -->$", re.M | re.S)
FENCE_RE = re.compile(r"^```.*?^```", re.M | re.S)  # an example block inside a code fence is not a table
DEFAULT_METRICS = ("eval/accuracy:final", "eval/accuracy:best", "eval/accuracy:auc", "eval/accuracy:slope")


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `credo report` (credo/cli.py adds the subcommand and calls report_main)."""
    p.add_argument("source", nargs="?", help="a sweep YAML (its results file, metrics, baseline and named comparisons) "
                   "or a results .jsonl file")
    p.add_argument("--metric", action="append", default=None, metavar="KEY[:REDUCE[:ARG]]",
                   help="a column: a metrics.jsonl key and how a run's curve becomes one number, "
                   f"REDUCE one of {', '.join(REDUCES)} (default final); ARG is k for last_k_mean, min or max for best; "
                   "repeat for more columns (default: the sweep's metrics, or eval/accuracy final, best, auc and slope)")
    p.add_argument("--baseline", default=None, help="the variant the others are compared with (default: the sweep's)")
    p.add_argument("--compare", action="append", default=None, metavar="'A > B'",
                   help="a comparison named in advance, on the first metric: 'A > B', 'A < B' or 'A vs B'; "
                   "repeatable; Holm-adjusted together (default: the sweep's comparisons)")
    p.add_argument("--variants", nargs="+", default=None, help="the rows, in order (default: the sweep's, or the "
                   "order of the results file)")
    p.add_argument("--sweep", default=None, help="the sweep name to report when the results file holds several")
    p.add_argument("--no-overview", action="store_true", help="leave out the overview table (mean ± std per metric)")
    p.add_argument("--notes", action="store_true", help="add the paragraph saying how each statistic is computed")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also draw the curves (mean over seeds, 95%% band)")
    p.add_argument("--curves", nargs="+", default=None, metavar="KEY",
                   help="the panels of --plot (default: the sweep's curves, or the metrics' keys)")
    p.add_argument("--out", default=None, metavar="FILE.md", help="write the markdown here instead of printing it")
    p.add_argument("--update", default=None, metavar="DOC.md",
                   help="rewrite every `<!-- credo report ... -->` block of this markdown file from its command")
    p.add_argument("--check", nargs="?", const="", default=None, metavar="DOC.md",
                   help="exit 1, naming the blocks, when a block of this markdown file differs from its command's output, "
                   f"or (on a page holding '{PROSE_MARK}') when an interval in its prose is in none of its blocks, "
                   "or when an interval marked <!-- credo:interval ... --> differs from its recomputation, "
                   "or a <!-- credo:quoted KIND: REASON --> marker has no interval; "
                   "without DOC.md: every page under docs/ holding a block or a marker, and exit 1 when a page's prose "
                   "prints an interval with no marker (outside a quoted region, a page with the prose mark, or a "
                   "page marked historical)")


def parse_metric(text: str) -> Metric:
    """'eval/accuracy:final', 'train/reward_mean:last_k_mean:10', 'eval/accuracy:best:min' -> a Metric."""
    key, _, rest = text.partition(":")
    reduce, _, arg = rest.partition(":")
    reduce = reduce or "final"
    if not key or reduce not in REDUCES:
        raise ConfigError(f"--metric {text!r}: expected KEY[:REDUCE[:ARG]] with REDUCE one of {', '.join(REDUCES)}")
    k, mode = 1, "max"
    if arg and reduce == "last_k_mean" and arg.isdigit() and int(arg) >= 1:
        k = int(arg)
    elif arg and reduce == "best" and arg in ("min", "max"):
        mode = arg
    elif arg or reduce == "last_k_mean":
        raise ConfigError(f"--metric {text!r}: ARG is k >= 1 for last_k_mean (e.g. train/reward_mean:last_k_mean:10) "
                          "or min/max for best, and nothing for the other reductions")
    return Metric(key=key, reduce=reduce, k=k, mode=mode, label=default_label(key, reduce, k, mode))


@dataclass
class Request:
    source: Path
    """The sweep file or results file the table is made from."""
    records: list[dict]
    metrics: list[Metric]
    variants: list[str]
    baseline: str | None
    comparisons: list
    curves: list[str]
    title: str


def _request(args: argparse.Namespace) -> Request:
    """The records and the table's design from a sweep file or a results file, with the flags' overrides."""
    if not args.source:
        raise ConfigError("credo report: give a sweep YAML or a results .jsonl file (or --update/--check DOC.md)")
    src = Path(args.source)
    sweep = load_sweep(src) if src.suffix in (".yaml", ".yml") else None
    path = sweep.results if sweep else src
    if not Path(path).is_file():
        raise ConfigError(f"results file not found: '{path}'" + (f" (named by the sweep '{src}'; run the sweep first)"
                                                                  if sweep else ""))
    from credo.ablate.results import read_results

    records = read_results(path)
    names = list(dict.fromkeys(r["sweep"] for r in records))
    name = args.sweep or (sweep.name if sweep else None) or (names[0] if len(names) == 1 else None)
    if name is None or name not in names:
        raise ConfigError(f"results file '{path}' holds sweeps {', '.join(names) or '(none)'}; "
                          + ("name one with --sweep" if name is None else f"not '{name}'"))
    records = [r for r in records if r["sweep"] == name]
    if args.metric:
        metrics = [parse_metric(m) for m in args.metric]
    else:
        metrics = sweep.metrics if sweep else [parse_metric(m) for m in DEFAULT_METRICS]
    variants = args.variants or (list(sweep.variants) if sweep else list(dict.fromkeys(r["variant"] for r in records)))
    baseline = args.baseline if args.baseline is not None else (sweep.baseline if sweep else None)
    try:
        comparisons = ([parse_comparison(c, variants, "--compare") for c in args.compare] if args.compare is not None
                       else (sweep.comparisons if sweep else []))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    curves = args.curves or (sweep.curves if sweep else list(dict.fromkeys(m.key for m in metrics)))
    return Request(source=src, records=[r for r in records if r["variant"] in variants], metrics=metrics, variants=variants,
                   baseline=baseline, comparisons=comparisons, curves=curves, title=name)


def summarize_request(req: Request, doc: Path | None = None):
    """The statistics of a request (a credo.ablate.report.Summary), each named comparison with whether git shows it
    named before the runs: in the sweep file, or in `doc` (the page whose block names it with --compare)."""
    from credo.ablate.prereg import mark_named
    from credo.ablate.report import summarize_records

    try:
        summary = summarize_records(req.records, req.metrics, variants=req.variants, baseline=req.baseline,
                                    comparisons=req.comparisons)
    except ValueError as e:
        raise ConfigError(f"credo report: {e}") from None
    # where the comparisons were named: the sweep file when the table is made from one, else the page whose
    # block names them with --compare (a mention of the same text on that page counts too: see prereg)
    sweep_file = req.source if req.source.suffix in (".yaml", ".yml") else None
    sources = [sweep_file] if sweep_file else ([doc] if doc else [])
    return mark_named(summary, sources)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="credo report", description="a table and its curves from a sweep's results")
    add_report_arguments(p)
    return p


def block_text(argv: str, doc: Path | None = None) -> str:
    """The markdown a doc block's command makes (its --plot, --out and --update are not acted on); `doc`, the page
    that holds the block, is where its --compare comparisons are named."""
    from credo.ablate.tables import render_markdown

    args = _parser().parse_args(shlex.split(argv))
    return render_markdown(summarize_request(_request(args), doc), overview=not args.no_overview, notes=args.notes)


def _in_fence(text: str, pos: int) -> bool:
    return any(f.start() <= pos < f.end() for f in FENCE_RE.finditer(text))


def doc_blocks(text: str) -> list[tuple[str, str]]:
    """(command, body) of every `<!-- credo report ... -->` block of a markdown text outside code fences, in order."""
    return [(m["argv"], m["body"]) for m in BLOCK_RE.finditer(text) if not _in_fence(text, m.start())]


def prose_marked(text: str, mark: str = PROSE_MARK) -> bool:
    """Whether the page holds the prose mark (or `mark`) on a line of its own (a mention in a sentence does not count)."""
    return any(line.strip() == mark for line in FENCE_RE.sub("", text).splitlines())


def prose_intervals_unmatched(text: str) -> list[str]:
    """The intervals printed in a page's prose (outside blocks and code fences, without a credo:interval marker,
    which is checked by recomputation instead) that none of its blocks holds."""
    rows = [line for _, body in doc_blocks(text) for line in body.splitlines()]
    found = [" ".join(iv.split()) for iv in INTERVAL_RE.findall(_unmarked_prose(text))]
    return [iv for iv in found if not any(_stands_in(iv, row) for row in rows)]


def _unmarked_prose(text: str) -> str:
    """The page without its blocks, its code fences and its marked intervals (marker and printed interval)."""
    from credo.ablate.prose import unquoted

    return FENCE_RE.sub("", BLOCK_RE.sub("", unquoted(text)))


def _stands_in(iv: str, row: str) -> bool:
    """Whether a table row holds the interval: the bracket as printed and, in the same row, the estimate (a Δ
    cell prints them together, a variant's row as 'mean ± std | [low, high]')."""
    estimate, bracket = iv.split(" [", 1)
    return "[" + bracket in row and estimate in row


def report_pages(root: Path = Path("docs")) -> list[Path]:
    """The pages under `root` that hold a `credo report` block, the prose mark or a credo:interval marker, sorted."""
    return sorted(p for p in root.rglob("*.md") if doc_blocks(p.read_text()) or prose_marked(p.read_text())
                  or _has_markers(p.read_text()) or prose_marked(p.read_text(), HISTORY_MARK))


def _has_markers(text: str) -> bool:
    from credo.ablate.prose import MARKER_RE, QUOTED_ANY_RE, REGION_RE

    bare = FENCE_RE.sub("", text)
    return any(r.search(bare) is not None for r in (MARKER_RE, QUOTED_ANY_RE, REGION_RE))


def _list_unchecked(root: Path) -> int:
    """Say which pages print intervals in prose that no check covers (no marker, no prose mark): the work left to
    do; and how many a historical page holds. Returns how many pages print unchecked intervals."""
    unchecked = 0
    for page in sorted(root.rglob("*.md")):
        text = page.read_text()
        n = len(INTERVAL_RE.findall(_unmarked_prose(text)))
        if n and prose_marked(text, HISTORY_MARK):
            print(f"credo report: {page}: {n} intervals in prose, historical: not recomputed (the page's "
                  f"'{HISTORY_MARK}': first runs whose per-seed values were not kept)")
        elif n and not prose_marked(text):
            unchecked += 1
            print(f"credo report: {page}: {n} intervals in prose, not checked (no credo:interval or credo:quoted "
                  "marker, and the page has no prose mark)", file=sys.stderr)
    return unchecked


def _update(doc: Path, *, check: bool) -> int:
    text = doc.read_text()
    stale = []

    def remake(m: re.Match) -> str:
        if _in_fence(text, m.start()):
            return m[0]
        body = block_text(m["argv"], doc)
        if body != m["body"]:
            stale.append(m["argv"])
        if not check:
            args = _parser().parse_args(shlex.split(m["argv"]))
            if args.plot:
                from credo.ablate.report import plot_curves

                req = _request(args)
                plot_curves(req.records, req.curves, req.variants, args.plot, req.title)
        return f"<!-- credo report {m['argv']} -->\n{body}<!-- /credo report -->"

    new = BLOCK_RE.sub(remake, text)
    n = len(doc_blocks(text))
    if check:
        for argv in stale:
            print(f"credo report: stale block in {doc}: credo report {argv}", file=sys.stderr)
        print(f"credo report: {n - len(stale)}/{n} blocks of {doc} match their commands")
        loose = prose_intervals_unmatched(text) if prose_marked(text) else []
        for iv in loose:
            print(f"credo report: {doc}: the prose prints {iv}, which none of the page's blocks holds", file=sys.stderr)
        if prose_marked(text):
            print(f"credo report: {len(INTERVAL_RE.findall(_unmarked_prose(text))) - len(loose)} unmarked "
                  f"intervals in the prose of {doc} stand in its blocks, {len(loose)} do not")
        wrong = _check_marked(doc, text) + _check_quoted(doc, text) + _check_historical(doc, text)
        return 1 if stale or loose or wrong else 0
    if new != text:
        doc.write_text(new)
    print(f"credo report: {len(stale)} of {n} blocks of {doc} rewritten")
    return 0


def _check_marked(doc: Path, text: str) -> int:
    """Recompute every credo:interval of a page (credo.ablate.prose); print each that differs. Returns how many."""
    from credo.ablate.prose import check_page

    marked = check_page(text)
    wrong = [m for m in marked if m.problem]
    for m in wrong:
        print(f"credo report: {doc}:{m.line}: credo:interval {m.spec}: {m.problem}", file=sys.stderr)
    if marked:
        print(f"credo report: {len(marked) - len(wrong)}/{len(marked)} marked intervals of {doc} match their "
              "recomputation")
    return len(wrong)


def _check_quoted(doc: Path, text: str) -> int:
    """Count the page's `credo:quoted` intervals by kind on the output; print each without an interval. Returns
    how many are wrong."""
    from credo.ablate.prose import quoted_intervals

    counts, problems = quoted_intervals(text)
    for p in problems:
        print(f"credo report: {doc}:{p}", file=sys.stderr)
    if counts:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
        print(f"credo report: {sum(counts.values())} intervals of {doc} quoted, not recomputed ({kinds})")
    return len(problems)


def _check_historical(doc: Path, text: str) -> int:
    """The historical mark is for pages of first runs only: refused (1) on a page with a block or a marker."""
    if prose_marked(text, HISTORY_MARK) and (doc_blocks(text) or _has_markers(text)):
        print(f"credo report: {doc}: '{HISTORY_MARK}' on a page with credo report blocks or credo:interval "
              "markers: its intervals have raw results; mark them instead", file=sys.stderr)
        return 1
    return 0


def report_main(args: argparse.Namespace) -> int:
    """`credo report`: print (or --out) the table, draw --plot; or --update / --check a doc's blocks.

    Returns 0, 1 when --check finds a stale block, 2 on bad input (the message names the file, flag or line).
    """
    try:
        return _report(args)
    except ConfigError as e:
        print(f"credo: config error: {e}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from credo.ablate.report import plot_curves
    from credo.ablate.tables import render_markdown

    if args.check == "":
        code = max((_update(page, check=True) for page in report_pages()), default=0)
        return max(code, 1 if _list_unchecked(Path("docs")) else 0)  # an unchecked interval fails the check
    if args.update or args.check:
        return _update(Path(args.update or args.check), check=args.check is not None)
    req = _request(args)
    text = render_markdown(summarize_request(req), overview=not args.no_overview, notes=args.notes)
    if args.out:
        Path(args.out).write_text(text)
        print(f"credo report: wrote {args.out}")
    else:
        print(text, end="")
    if args.plot:
        plot_curves(req.records, req.curves, req.variants, args.plot, req.title)
        print(f"credo report: wrote {args.plot}")
    return 0
