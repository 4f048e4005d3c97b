"""Pre-registration that git enforces (issue 57, B.1): `credo ablate` refuses a sweep file that is not committed
unless `--exploratory`; each results line records the sweep file's commit; `credo report` says per comparison
whether it was named before the run, from git (credo.ablate.prereg), for new lines and for lines without the field."""

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from credo import ablate
from credo.ablate import prereg, report_cli
from credo.ablate.results import read_results
from credo.config import ConfigError
from tests.ablate.test_sweep import fake_trainer, write_sweep  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository in tmp_path with an identity of its own and no user config."""
    for k, v in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                 "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}.items():
        monkeypatch.setenv(k, v)
    git(tmp_path, "init", "-q")
    return tmp_path


def git(cwd, *args, env=None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


def commit(cwd, path, message="m") -> str:
    git(cwd, "add", str(path))
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


def report(capsys, *argv) -> str:
    code = report_cli.report_main(report_cli._parser().parse_args([str(a) for a in argv]))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def named_rows(text: str) -> dict[str, str]:
    """comparison -> its 'named before the run' cell, from the named comparisons' table."""
    section = text.split("**Comparisons named:")[1]
    rows = [l.split("|") for l in section.splitlines() if l.startswith("| ") and not l.startswith("| comparison")]
    return {r[1].strip(): r[-2].strip() for r in rows}


def test_an_uncommitted_sweep_is_refused_and_exploratory_runs_are_marked(repo, fake_trainer, capsys):
    path = write_sweep(repo, results=str(repo / "res.jsonl"), comparisons=["b > a"])
    with pytest.raises(ConfigError, match=r"is not committed.*--exploratory"):
        ablate.run_sweep(path, jobs=2, poll_s=0.05)
    assert ablate.run_sweep(path, jobs=2, dry_run=True) == 0  # the dry run lists the runs and says so
    assert "a real run would be refused" in capsys.readouterr().err
    commit(repo, path)
    path.write_text(path.read_text() + "# edited after the commit\n")
    with pytest.raises(ConfigError, match=r"has uncommitted changes.*--exploratory"):
        ablate.run_sweep(path, jobs=2, poll_s=0.05)
    assert not (repo / "sweep").exists() and not (repo / "res.jsonl").exists()  # refused before anything ran
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05, exploratory=True) == 0
    capsys.readouterr()
    recs = read_results(repo / "res.jsonl")
    assert len(recs) == 4 and all(r["exploratory"] is True and r["sweep_commit"] is None for r in recs)
    out = report(capsys, path)
    assert "**Exploratory:** 4 of 4 runs were started with `credo ablate --exploratory`" in out
    assert named_rows(out) == {"b > a": "no"}
    table = (repo / "sweep" / "table.md").read_text()
    assert "**Exploratory:**" in table and named_rows(table) == {"b > a": "no"}
    assert "variant,n,exploratory," in (repo / "sweep" / "table.csv").read_text()
    assert [line.split(",")[2] for line in (repo / "sweep" / "table.csv").read_text().splitlines()[1:]] == ["2", "2"]


def test_a_committed_sweep_records_its_commit_and_a_later_comparison_is_not_named_before(repo, fake_trainer, capsys):
    path = write_sweep(repo, results=str(repo / "res.jsonl"), comparisons=["b > a"])
    named = commit(repo, path)
    git(repo, "commit", "-q", "--allow-empty", "-m", "unrelated")  # the file's last commit, not HEAD, is recorded
    assert ablate.run_sweep(path, jobs=2, poll_s=0.05) == 0
    assert named_rows(capsys.readouterr().out) == {"b > a": "yes"}  # credo ablate's own table
    recs = read_results(repo / "res.jsonl")
    assert {(r["sweep_commit"], r["exploratory"], r["sweep_file"]) for r in recs} == {(named, False, str(path))}
    assert named_rows(report(capsys, path)) == {"b > a": "yes"}
    # a comparison added to the sweep file after its runs: the file at the runs' sweep_commit does not name it
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(data | {"comparisons": ["b > a", "a vs b"]}, sort_keys=False))
    commit(repo, path)
    assert named_rows(report(capsys, path)) == {"b > a": "yes", "a vs b": "no"}


def _old_line(variant, seed, commit_, date="2026-12-05T10:00:00", wall_s=60.0):
    """A results line as written before issue 57: no sweep_file, sweep_commit or exploratory."""
    return {"sweep": "s", "variant": variant, "seed": seed, "commit": commit_, "date": date, "wall_s": wall_s,
            "final": {}, "curves": {}}


def test_old_lines_are_judged_from_git_by_their_commit_or_time(repo):
    sweep = repo / "sweep.yaml"
    sweep.write_text("comparisons: []  # b > a\n")  # a comment does not name it
    before = commit(repo, sweep)
    sweep.write_text("comparisons: ['b >  a']\n")  # spaces as a person types them
    named = commit(repo, sweep)
    assert prereg.first_naming(str(sweep), "b > a")[0] == named
    lines = lambda c, **kw: [_old_line(v, s, c, **kw) for v in "ab" for s in (0, 1)]  # noqa: E731
    assert prereg.named_before("b > a", lines(before), [sweep]) == "no"      # ran before the naming commit
    assert prereg.named_before("b > a", lines(named), [sweep]) == "yes"     # ran at it
    assert prereg.named_before("b > a", lines(named + "+dirty"), [sweep]) == "yes"
    mixed = lines(named)[:3] + lines(before)[3:]
    assert prereg.named_before("b > a", mixed, [sweep]) == "no"              # one run before it is enough
    # a commit this repository does not have: the run's time decides, 14 hours' margin for the local time zone
    when = int(git(repo, "log", "-1", "--format=%ct", named))
    stamp = lambda h: (datetime.fromtimestamp(when, timezone.utc).replace(tzinfo=None) + timedelta(hours=h)).isoformat(timespec="seconds")  # noqa: E731
    assert prereg.named_before("b > a", lines("1234567", date=stamp(20)), [sweep]) == "yes"
    assert prereg.named_before("b > a", lines("1234567", date=stamp(-20)), [sweep]) == "no"
    assert prereg.named_before("b > a", lines("1234567", date=stamp(3)), [sweep]) == "unknown"
    assert prereg.named_before("b > a", lines(named), []) == "unknown"       # no file names it
    assert prereg.named_before("a > b", lines(named), [sweep]) == "unknown"  # never named


def test_outside_git_the_answer_is_unknown_and_the_sweep_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("comparisons: ['b > a']\n")
    assert prereg.file_state(sweep) == "no git"
    with pytest.raises(ConfigError, match="is not inside a git repository"):
        prereg.registration(sweep, exploratory=False)
    assert prereg.registration(sweep, exploratory=True) == {"sweep_file": str(sweep), "sweep_commit": None,
                                                            "exploratory": True}
    assert prereg.named_before("b > a", [_old_line("a", 0, "abc"), _old_line("b", 0, "abc")], [sweep]) == "unknown"


def test_the_judges_comparisons_were_not_named_before_their_runs():
    """CE-RM best-of-N's and P-GenRM's comparisons first appear in 1fba97c, after both runs (issue 57, B.2)."""
    doc = Path("docs/reproductions.md")
    text = (REPO / doc).read_text()
    for results, comparisons in [("ce_rm_bon", ["judge > random", "judge > well_formed_random"]),
                                 ("pgenrm_scaling", ["ind_pro > none", "ind_pro > ind_more"])]:
        argv, body = next((a, b) for a, b in report_cli.doc_blocks(text) if f"docs/results/{results}.jsonl" in a)
        rows = named_rows(body)
        assert {c: rows[c] for c in comparisons} == dict.fromkeys(comparisons, "no"), results
