"""Issue 57 A.5: an error a user can cause reads like a config error (one `credo: error:` line); a traceback is for
bugs, and a one-process run's traceback has no `[rank0]:` prefix on every line (torch.distributed's excepthook)."""

from __future__ import annotations

import pytest

from credo import cli
from credo.errors import ConfigError, EnvFailureError, RewardFunctionError, TrainingError, UserError
from tests.e2e.common import run_cli, tiny_overrides


def test_every_error_a_user_can_cause_is_a_user_error():
    from credo.distributed.ray.runtime import ClusterWorkerError

    for cls in (ConfigError, TrainingError, RewardFunctionError, EnvFailureError, ClusterWorkerError):
        assert issubclass(cls, UserError), cls
    assert issubclass(ConfigError, ValueError) and issubclass(TrainingError, RuntimeError)  # callers' excepts hold


def test_a_user_error_is_one_line_and_exit_1(monkeypatch, capsys):
    from credo.distributed.ray.runtime import ClusterWorkerError

    def fails(args):
        raise ClusterWorkerError("role 'rollout': 2 of 3 worker(s) asking for {CPU: 1} were placed and ready")

    monkeypatch.setattr(cli, "_check", fails)
    assert cli.main(["check", "recipes/quickstart.yaml"]) == 1
    err = capsys.readouterr().err
    assert err == "credo: error: role 'rollout': 2 of 3 worker(s) asking for {CPU: 1} were placed and ready\n"


def test_in_process_the_users_code_is_one_line_and_a_bug_a_plain_traceback(monkeypatch, capsys):
    import sys

    from tests.spine import user_code

    monkeypatch.setattr(cli, "_check", lambda args: user_code.reward_stage_with_a_typo(None))
    assert cli.main(["check", "recipes/quickstart.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("credo: error: KeyError in your code (") and err.count("\n") == 1 and "user_code.py:6" in err

    def bug(args):  # an AttributeError in credo's own code: a bug, its traceback
        return cli.interrupted_line(None, "r.yaml", [])

    monkeypatch.setattr(cli, "_check", bug)
    monkeypatch.setattr(sys, "excepthook", lambda *a: print("[rank0]: hook", file=sys.stderr))  # torch's, in effect
    assert cli.main(["check", "recipes/quickstart.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last)") and "[rank0]" not in err and "AttributeError" in err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(Heavy: two CLI runs, about a minute each on a loaded 2-core machine.) Two runs that fail while being built: the user's factory raises; the user's factory returns junk (credo's
    code then raises: shown as a traceback)."""
    out = {}
    for name in ("reward_stage_with_a_typo", "reward_stage_returning_nothing_usable"):
        folder = tmp_path_factory.mktemp(name)
        out[name] = run_cli(["run", "recipes/quickstart.yaml", *tiny_overrides(
            folder, **{"run.steps": 1, "sft.steps": 0, "stages.reward": f"tests.spine.user_code:{name}"})],
            env_extra={"CREDO_CACHE": str(folder / "cache")}, timeout=300)
    return out


@pytest.mark.heavy
def test_an_exception_in_the_users_own_code_is_one_line_naming_it(runs):
    p = runs["reward_stage_with_a_typo"]
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("credo: error: KeyError in your code (") and "user_code.py:6, in reward_stage_with_a_typo" in last
    assert "Traceback" not in p.stderr and "[rank0]" not in p.stderr


@pytest.mark.heavy
def test_a_bug_keeps_its_traceback_without_a_rank_prefix(runs):
    p = runs["reward_stage_returning_nothing_usable"]
    assert p.returncode == 1
    assert "Traceback (most recent call last)" in p.stderr, p.stderr[-3000:]
    assert not [line for line in p.stderr.splitlines() if line.startswith("[rank0]")]


@pytest.mark.parametrize("argv,line", [
    (["run", "recipes/quickstart.yaml", "--steps", "5", "run.output_dir=x"],
     "credo: error: credo run has no option '--steps'; recipe keys are set as key=value: did you mean run.steps=5 or "
     "sft.steps=5?"),
    (["check", "recipes/quickstart.yaml", "--optim.lr=1e-3"],
     "credo: error: credo check has no option '--optim.lr'; recipe keys are set as key=value: did you mean "
     "optim.lr=1e-3?"),
    (["check", "recipes/quickstart.yaml", "--bogus-flag"],
     "credo: error: credo check has no option '--bogus-flag' (`credo check --help` lists its options; recipe keys are "
     "set as key=value)"),
])
def test_an_unknown_option_is_one_line_naming_it(argv, line, capsys):
    """Round-4 trial: `credo run recipes/quickstart.yaml --steps 5 run.output_dir=x` printed credo's top-level usage
    and 'unrecognized arguments: --steps 5 run.output_dir=x', the good override listed as if it were wrong too."""
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_stray_positional_is_still_argparses_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["list", "extra"])
    assert e.value.code == 2 and "unrecognized arguments: extra" in capsys.readouterr().err
