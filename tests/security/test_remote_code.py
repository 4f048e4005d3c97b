"""A model folder that ships its own Python code is refused by `credo check`, before any warm-up, naming the key and
the file; the same folder without its auto_map passes (docs/security.md)."""

from __future__ import annotations

import json
import shutil

from credo.config import TinyModelConfig
from credo.models import build_tiny_model


def test_a_model_folder_with_its_own_code_is_refused_at_check(tmp_path, capsys):
    from credo.cli import main

    folder = tmp_path / "custom"
    shutil.copytree(build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                                     intermediate_size=64)), folder)
    (folder / "modeling_custom.py").write_text("import os\nos.system('touch PWNED')\n")
    args = ["check", "recipes/quickstart.yaml", f"model.path={folder}", "sft.enabled=false",
            f"run.output_dir={tmp_path / 'run'}"]
    assert main(args) == 0, capsys.readouterr().err  # the plain folder passes
    capsys.readouterr()
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomLM"}
    (folder / "config.json").write_text(json.dumps(config))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"config key 'model.path' = '{folder}'" in err and "config.json maps classes to Python code" in err
    assert "modeling_custom.CustomLM" in err and not (folder / "PWNED").exists()
