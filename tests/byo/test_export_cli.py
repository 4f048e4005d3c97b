"""`credo export` errors name what is wrong; `credo list` names the file and hf tasks."""

import json

from credo.cli import list_names, main


def test_export_of_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "has no meta.json: expected a credo checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_when_the_base_model_is_gone(tmp_path, capsys):
    (tmp_path / "meta.json").write_text(json.dumps({"policy_path": str(tmp_path / "gone"), "step": 3}))
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"'{tmp_path / 'gone'}', meta.json policy_path) is missing: pass --base-model" in err


def test_list_names_the_own_data_tasks():
    text = list_names()
    assert "file: your JSONL / JSON / Parquet / CSV" in text and "hf:<name-or-folder>" in text
