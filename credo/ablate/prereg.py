"""Pre-registration that git enforces: a sweep's comparisons are committed before its runs, or the runs are exploratory.

`credo ablate` (issue 57, B.1):

- refuses a sweep whose file is not clean in git (tracked, committed, no uncommitted change), because its named
  comparisons would then be on record nowhere; `--exploratory` runs it anyway and marks every results line
  `exploratory: true` (and every table made from them says so);
- records in each results line `sweep_file` (the sweep file's path, as given) and `sweep_commit` (the last commit
  that touched it, `git log -1 -- FILE`: the version that named the run's comparisons; null when exploratory).

`credo report` says per named comparison whether it was **named before the run**, from git, never from prose:

- a line with `sweep_commit`: yes when the comparison is in the sweep file at that commit and the line is not
  exploratory (the file was clean, so that commit is what ran); no otherwise;
- an older line (no `sweep_commit`): the first commit at which the comparison appears in a file that names it (the
  sweep file, parsed at each of its commits, or the doc page whose `credo report` block names it with `--compare`,
  found with `git log -S`), must
  be an ancestor of, or equal to, the line's `commit` (the code the run started from). When the line's commit is not
  in this repository, its time decides: the naming commit more than 14 hours (any time zone; `date` is local time)
  before the run's start (`date` - `wall_s`) is yes, more than 14 hours after its end no, else unknown;
- yes for a comparison only when it is yes for every run of its two variants; no when it is no for any; else unknown.
  Outside git (a tarball, a shallow clone missing those commits) the answer is unknown.
"""

from __future__ import annotations

import functools
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from credo.config import ConfigError

TZ_MARGIN = timedelta(hours=14)
"""A results line's `date` is local time without a zone: at most 14 hours from UTC either way."""


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def file_state(path: str | Path) -> str:
    """'clean' (tracked and unmodified), 'modified', 'untracked' or 'no git' (not inside a git work tree)."""
    path = Path(path).resolve()
    tracked = _git(path.parent, "ls-files", "--error-unmatch", "--", path.name)
    if tracked is None or "not a git repository" in tracked.stderr.lower():
        return "no git"
    if tracked.returncode != 0:
        return "untracked"
    status = _git(path.parent, "status", "--porcelain", "--", path.name)
    return "clean" if status is not None and status.returncode == 0 and not status.stdout.strip() else "modified"


@functools.lru_cache(maxsize=None)
def last_commit(path: str) -> str | None:
    """The full hash of the last commit that touched `path` (None outside git or when none did)."""
    p = Path(path).resolve()
    out = _git(p.parent, "log", "-1", "--format=%H", "--", p.name)
    return out.stdout.strip() or None if out is not None and out.returncode == 0 else None


def registration(path: str | Path, *, exploratory: bool) -> dict:
    """The fields a results line records about its sweep file; ConfigError when the file is not committed and
    the run is not exploratory (the message says what to do)."""
    state = file_state(path)
    if state != "clean" and not exploratory:
        why = {"modified": "has uncommitted changes", "untracked": "is not committed",
               "no git": "is not inside a git repository"}[state]
        raise ConfigError(f"sweep '{path}' {why}: its named comparisons would be on record nowhere before the runs. "
                          "Commit the sweep file first (then every results line records the commit that named its "
                          "comparisons), or pass --exploratory to run it anyway, every result marked exploratory")
    commit = last_commit(str(path)) if state == "clean" else None
    return {"sweep_file": str(path), "sweep_commit": commit, "exploratory": bool(exploratory or state != "clean")}


def _file_at(path: Path, commit: str) -> str | None:
    out = _git(path.parent, "show", f"{commit}:./{path.name}")
    return out.stdout if out is not None and out.returncode == 0 else None


def _names(path: Path, text: str, comparison: str) -> bool:
    """Whether the file's text (at some commit) names the comparison: a sweep file in its `comparisons` list (parsed,
    so a comment does not count), any other file (a doc page's `--compare`) anywhere in it."""
    if path.suffix not in (".yaml", ".yml"):
        return comparison in text
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return False
    listed = data.get("comparisons") if isinstance(data, dict) else None
    return isinstance(listed, list) and comparison in {" ".join(str(c).split()) for c in listed}


@functools.lru_cache(maxsize=None)
def first_naming(path: str, comparison: str) -> tuple[str, int] | None:
    """(commit, committer time in s) of the first commit at which `path` names `comparison`, or None."""
    p = Path(path).resolve()
    # a sweep file has few versions: parse each (any spacing); a doc page has many: only those where the text changes
    pickaxe = [] if p.suffix in (".yaml", ".yml") else [f"-S{comparison}"]
    out = _git(p.parent, "log", "--reverse", "--format=%H %ct", *pickaxe, "--", p.name)
    if out is None or out.returncode != 0:
        return None
    for line in out.stdout.split("\n"):
        if line.strip():
            commit, when = line.split()
            text = _file_at(p, commit)
            if text is not None and _names(p, text, comparison):
                return commit, int(when)
    return None


@functools.lru_cache(maxsize=None)
def _is_ancestor(cwd: str, older: str, newer: str) -> bool | None:
    """Whether `older` is an ancestor of (or equal to) `newer`; None when git does not know `newer`."""
    known = _git(Path(cwd), "cat-file", "-e", f"{newer}^{{commit}}")
    if known is None or known.returncode != 0:
        return None
    out = _git(Path(cwd), "merge-base", "--is-ancestor", older, newer)
    return None if out is None or out.returncode not in (0, 1) else out.returncode == 0


def _by_time(named_at: int, rec: dict) -> str:
    try:
        end = datetime.fromisoformat(rec["date"]).replace(tzinfo=None)
    except (KeyError, TypeError, ValueError):
        return "unknown"
    start = end - timedelta(seconds=float(rec.get("wall_s") or 0))
    named = datetime.fromtimestamp(named_at, timezone.utc).replace(tzinfo=None)
    if named < start - TZ_MARGIN:
        return "yes"
    if named > end + TZ_MARGIN:
        return "no"
    return "unknown"


def _one_run(rec: dict, comparison: str, sources: list[Path]) -> str:
    """yes / no / unknown for one results line."""
    if rec.get("exploratory"):
        return "no"
    if rec.get("sweep_commit") and rec.get("sweep_file"):
        path = Path(rec["sweep_file"])
        text = _file_at(path.resolve(), rec["sweep_commit"]) if path.exists() else None
        if text is not None:
            return "yes" if _names(path, text, comparison) else "no"
    answers = []
    for src in sources:
        named = first_naming(str(src), comparison) if src.exists() else None
        if named is None:
            continue
        run_commit = str(rec.get("commit") or "").removesuffix("+dirty")
        ancestor = _is_ancestor(str(src.resolve().parent), named[0], run_commit) if run_commit not in ("", "unknown") else None
        answers.append(_by_time(named[1], rec) if ancestor is None else ("yes" if ancestor else "no"))
    if "yes" in answers:
        return "yes"
    return "no" if "no" in answers else "unknown"


def mark_named(summary, sources: list[Path]):
    """Set `named_before` on each named comparison of a credo.ablate.report.Summary; returns the summary."""
    for c in summary.named:
        c.named_before = named_before(f"{c.a} {c.expect} {c.b}", summary.records, sources)
    return summary


def named_before(comparison: str, records: list[dict], sources: list[Path]) -> str:
    """'yes', 'no' or 'unknown': whether `comparison` ('a > b') was committed, in one of `sources` (or the records'
    own sweep_file at sweep_commit), before every run of its two variants (rules in this module's docstring)."""
    a, _, b = comparison.split()
    runs = [r for r in records if r["variant"] in (a, b)]
    answers = {_one_run(r, comparison, sources) for r in runs}
    if not runs or "no" in answers:
        return "no" if runs else "unknown"
    return "yes" if answers == {"yes"} else "unknown"
