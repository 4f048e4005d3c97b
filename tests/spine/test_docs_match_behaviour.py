"""Issue 57 A.8: what the docs and help say against what credo does, for the lines a new user follows first."""

from __future__ import annotations

import re
from pathlib import Path

from credo import cli

ROOT = Path(__file__).resolve().parents[2]


def test_getting_started_says_what_credo_check_prints(capsys):
    """`credo check` prints one OK line; the config only with --show. A doc comment that promises printing must
    show --show on its command."""
    lines = [l for l in (ROOT / "docs/getting-started.md").read_text().splitlines() if "credo check" in l and "#" in l]
    assert lines
    for line in lines:
        command, comment = line.split("#", 1)
        if re.search(r"\bprint", comment) and "--show" not in command:
            assert "--show" in comment, line


def test_cluster_doc_says_the_default_reward_pool_takes_whole_cpus():
    from credo.distributed.ray.config import ClusterConfig, resources_of

    cfg = ClusterConfig()
    assert resources_of(cfg.reward) == {"CPU": 1} and cfg.reward.workers == 4  # the behaviour the page states
    text = " ".join((ROOT / "docs/cluster.md").read_text().split())
    assert "The default reward pool takes whole CPUs" in text and "up to `cluster.reward.workers` (4) at once" in text


def test_run_help_lists_run_progress_and_every_run_setting(capsys):
    from credo.config.sections import RunConfig

    try:
        cli.main(["run", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert re.search(r"run\.progress +Show progress: a bar on a terminal", out)
    for name in RunConfig.__dataclass_fields__:
        assert f"run.{name} " in out, name


def test_a_dry_run_says_a_real_run_appends_to_a_committed_results_file(tmp_path, capsys):
    from credo.ablate.scheduler import run_sweep
    from credo.tracking import tracked_in_git

    assert tracked_in_git(ROOT / "docs/results/critics.jsonl") and not tracked_in_git(tmp_path / "x.jsonl")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: trial\nbase: {ROOT}/recipes/quickstart.yaml\nseeds: [0]\nvariants: {{a: [run.steps=2]}}\n"
                     f"output_dir: {tmp_path}/out\nresults: {ROOT}/docs/results/critics.jsonl\n")
    assert run_sweep(sweep, dry_run=True) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"a real run appends one line per finished run to {ROOT}/docs/results/critics.jsonl, a file "
                    "committed in git: the new lines show in `git diff`")
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
