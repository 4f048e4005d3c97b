"""Issue 57 A.5, second part: bad input met while a run is built reads like a config error.

Each case below is a user's bad input that, before this change, `credo check` (and so `credo run`, whose preflight
is the same) met as a raw ValueError / StopIteration / datasets error with a traceback, or passed only to fail
after the warm-up (a critic folder that is not there, 'abc' for a clip range: a TypeError inside the first update)
or to run silently wrong ('maybe' for a bool is a true string). Each is replayed through the CLI's entry point and must give exit 2, one
`credo: config error:` line naming the key or file at fault, and no traceback.
"""

from __future__ import annotations

import pytest

from credo import cli
from tests.e2e.common import run_cli

QUICK = "recipes/quickstart.yaml"


def _files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", answer\n')
    (tmp_path / "no_model").mkdir()
    return tmp_path


# (id, recipe, overrides (with {tmp} for the test's folder), words the one line must hold)
CASES = [
    ("empty_data_file", QUICK, ["task.name=file", "task.kwargs={train: {tmp}/empty.jsonl}"],
     ["task.kwargs.train", "empty.jsonl", "empty"]),
    ("guess_env_low_above_high", "recipes/multiturn.yaml", ["env.kwargs.low=9", "env.kwargs.high=1"],
     ["env.kwargs", "low = 9 > high = 1"]),
    ("mastermind_env_colours", "recipes/multiturn_mastermind.yaml", ["env.kwargs.colours=12"],
     ["env.kwargs.colours = 12"]),
    ("shop_env_page_size", "recipes/shop.yaml", ["env.kwargs.page_size=0"], ["env.kwargs", "page_size = 0"]),
    ("vault_env_range", "recipes/multiturn.yaml", ["env.id=credo:Vault-v0", "env.kwargs={low: 5, high: 1}"],
     ["env.kwargs", "low=5, high=1"]),
    ("shop_env_vocab_not_numbers", "recipes/shop.yaml", ["env.kwargs.vocab=abc"], ["env.kwargs", "Shop", "'a'"]),
    ("loss_kwarg_not_a_number", QUICK, ["algo.loss_kwargs={clip_low: abc}"],
     ["algo.loss_kwargs.clip_low", "'abc'", "expected a number"]),
    ("advantage_kwarg_not_a_bool", QUICK, ["algo.advantage_kwargs={norm_std: maybe}"],
     ["algo.advantage_kwargs.norm_std", "expected true or false"]),
    ("task_kwarg_not_a_bool", QUICK, ["task.kwargs.fixed_width=maybe"], ["task.kwargs.fixed_width", "true or false"]),
    ("critic_path_missing", "recipes/ppo.yaml", ["critic.path={tmp}/nope"], ["critic.path", "does not exist"]),
    ("critic_path_not_a_model", "recipes/ppo.yaml", ["critic.path={tmp}/no_model"], ["critic.path", "no config.json"]),
    # round-4 trial: these passed credo check, then were a TypeError traceback from credo's call site after the warm-up
    ("stage_factory_is_a_reward_fn", QUICK, ["stages.advantage=tests.spine.user_code:a_reward_function_not_a_factory"],
     ["config key 'stages.advantage'", "a_reward_function_not_a_factory", "(responses, problems)", "'problems'"]),
    ("stage_factory_setting_missing", QUICK,
     ["stages.advantage=tests.spine.user_code:advantage_stage_with_a_required_setting"],
     ["config key 'stages.advantage'", "'scale'"]),
]


def _check(capsys, recipe, overrides, tmp):
    code = cli.main(["check", recipe, *[o.replace("{tmp}", str(tmp)) for o in overrides]])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name,recipe,overrides,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_config_error_line(name, recipe, overrides, words, tmp_path, capsys):
    code, err = _check(capsys, recipe, overrides, _files(tmp_path))
    assert "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("credo: config error: "), err[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_a_critic_path_that_loads_still_passes(tmp_path, capsys):
    """The new critic.path check refuses only what cannot load: the built tiny model's own folder passes."""
    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model

    folder = build_tiny_model(TinyModelConfig(num_layers=2, tie_word_embeddings=False))
    code, err = _check(capsys, "recipes/ppo.yaml", [f"critic.path={folder}"], tmp_path)
    assert code == 0, err


@pytest.mark.heavy
def test_a_malformed_data_file_names_the_file_and_its_row(tmp_path):
    """(Heavy only for the import of `datasets`, ~4 s.) A JSONL line that is not JSON: datasets' own error says only
    'An error occurred while generating the dataset', after a traceback; now one line naming the key and file."""
    _files(tmp_path)
    p = run_cli(["check", QUICK, "task.name=file", f"task.kwargs={{train: {tmp_path}/broken.jsonl}}"], timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("credo: config error: config key 'task.kwargs.train'") and "broken.jsonl" in last
    assert "cannot be read as JSON" in last and "row 1" in last, last
    folder = tmp_path / "hf_folder"  # the same file as a Hugging Face data folder (task.name hf:<folder>)
    folder.mkdir()
    (folder / "train.jsonl").write_text((tmp_path / "broken.jsonl").read_text())
    p = run_cli(["check", QUICK, f"task.name=hf:{folder}", "task.kwargs={}"], timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"credo: config error: task.name 'hf:{folder}' split 'train'") and "row 1" in last, last


@pytest.mark.heavy
def test_a_bad_env_setting_through_the_cli_process(tmp_path):
    """The same rule in a real `python -m credo.cli check` process (the in-process tests above call cli.main)."""
    p = run_cli(["check", "recipes/multiturn.yaml", "env.kwargs.low=9", "env.kwargs.high=1"], timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].startswith("credo: config error: env.kwargs: low = 9 > high = 1")


def test_reading_a_data_file_prints_nothing_of_datasets_own(tmp_path, capfd):
    """Round-4 trial of issue 57: a malformed JSONL printed datasets' 'Generating train split' bars and its ERROR
    log line twice (its handler and the CLI's) before credo's one line; a good file printed the bars. Now the
    config-error line is all of stderr, and a good file reads silently (the fd is captured: tqdm and logging both)."""
    _files(tmp_path)
    rows = ('{"prompt": "%d+1=", "answer": "%d"}\n' % (i, i + 1) for i in range(8))
    (tmp_path / "good.jsonl").write_text("".join(rows))
    code = cli.main(["check", QUICK, "task.name=file", f"task.kwargs={{train: {tmp_path}/broken.jsonl}}"])
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("credo: config error: config key 'task.kwargs.train'") and "row 1" in lines[0], lines
    from credo.tasks.data import load_rows_file

    rows = load_rows_file(str(tmp_path / "good.jsonl"), "task.kwargs.train")
    assert len(rows) == 8 and capfd.readouterr().err == ""
    import datasets  # the settings are the caller's again afterwards

    assert not datasets.are_progress_bars_disabled()


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_sweep_file_given_as_a_recipe_says_so(command, capsys):
    """Round-4 trial: `credo run recipes/ablations/shop.yaml` (recipes/ holds sweeps too) said "unknown config key
    'name'; did you mean 'families'?"; credo ablate already says the reverse ("this looks like a recipe")."""
    code = cli.main([command, "recipes/ablations/shop.yaml"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == ("credo: config error: 'recipes/ablations/shop.yaml' is a sweep file for `credo ablate` "
                        "(it names 'base: recipes/shop.yaml'), not a recipe: run the sweep with `credo ablate "
                        "recipes/ablations/shop.yaml`, or its base recipe with `credo run recipes/shop.yaml`")
