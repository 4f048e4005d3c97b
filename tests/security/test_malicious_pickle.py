"""A planted malicious pickle (issue 56, docs/security.md): in every file of a credo checkpoint that credo or
DeepSpeed loads, and as a model folder's pytorch_model.bin. Resume, export and `credo eval` refuse it with an error
naming the file, and its payload (writing a marker file) never runs.

The payload is a real one: `torch.load(weights_only=False)` of the planted file writes the marker (checked first,
so these tests fail if the file were loaded the old way). The checkpoints are written by a real DeepSpeed engine
(a small linear layer, CPU), and the attacker rewrites meta.json's manifest to match, as anyone who can plant a
file can.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from credo.checkpoint import _sha256, load_checkpoint, save_checkpoint
from credo.errors import UnsafeFileError
from credo.safe_load import check_model_folder, weights_only_torch_load

REPO = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling it runs `exec`, which writes `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('the payload ran')",)


def plant(f: Path, marker: Path, *, legacy: bool = False) -> None:
    """Rewrite torch file `f` with the payload beside its real content (so an unsafe load would succeed)."""
    content = torch.load(f, weights_only=False) if f.exists() else {}
    evil = {**(content if isinstance(content, dict) else {"content": content}), "payload": Payload(marker)}
    if legacy:  # a plain pickle, not torch's zip format
        with open(f, "wb") as out:
            pickle.dump(evil, out)
    else:
        torch.save(evil, f)


def rewrite_manifest(ckpt: Path) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["manifest"] = {str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                        for p in sorted(ckpt.rglob("*")) if p.is_file() and p.name != "meta.json"}
    (ckpt / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def make_engine():
    from credo.distributed.engine import build_engine, setup_distributed

    setup_distributed()

    def make(zero_stage: int):
        torch.manual_seed(0)
        engine = build_engine(torch.nn.Linear(4, 3), lr=1e-2, betas=[0.9, 0.999], weight_decay=0.0, grad_clip=1.0,
                              zero_stage=zero_stage, warmup_steps=10, micro_batch=2, grad_accum=1, bf16=False)
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()
        return engine

    return make


@pytest.fixture(scope="module")
def checkpoints(make_engine, tmp_path_factory):
    """A real credo checkpoint under ZeRO-1 and under ZeRO-3, with their engines: {stage: (engine, folder)}."""
    out = {}
    for stage in (1, 3):
        engine = make_engine(stage)
        root = tmp_path_factory.mktemp(f"zero{stage}")
        out[stage] = engine, save_checkpoint(engine, root, 1, meta={"sft_key": "k"}, keep_last=2)
    return out


def planted_copy(src: Path, rel: str, dst: Path, marker: Path, *, legacy: bool = False) -> Path:
    shutil.copytree(src, dst)
    plant(dst / rel, marker, legacy=legacy)
    rewrite_manifest(dst)
    return dst


def test_the_planted_file_runs_its_payload_when_loaded_the_old_way(checkpoints, tmp_path):
    marker = tmp_path / "marker"
    ckpt = planted_copy(checkpoints[1][1], "rng_rank0.pt", tmp_path / "c", marker)
    torch.load(ckpt / "rng_rank0.pt", weights_only=False)
    assert marker.read_text() == "the payload ran"


def _files(ckpt: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*.pt"))


@pytest.mark.parametrize("stage", [1, 3])
def test_resume_refuses_a_payload_in_every_file_it_loads_and_it_never_runs(checkpoints, tmp_path, stage):
    engine, ckpt = checkpoints[stage]
    files = _files(ckpt)
    assert "rng_rank0.pt" in files and any("optim_states" in f for f in files) and any("model_states" in f
                                                                                         for f in files)
    for i, rel in enumerate(files):
        for legacy in (False, True):
            marker = tmp_path / f"marker{i}{legacy}"
            bad = planted_copy(ckpt, rel, tmp_path / f"c{i}{legacy}", marker, legacy=legacy)
            with pytest.raises(UnsafeFileError) as err:
                load_checkpoint(engine, bad)  # the manifest matches: the check is the unpickler's
            # the zip format names the global; torch's unpickler stops a protocol-4 plain pickle at its first opcode
            assert str(bad / rel) in str(err.value) and ("'exec'" in str(err.value) or legacy), err.value
            assert not marker.exists(), f"the payload in {rel} ran"
    load_checkpoint(engine, ckpt)  # the untouched checkpoint still loads, weights-only


def test_a_components_engine_and_torch_files_are_loaded_weights_only_on_resume(checkpoints, tmp_path):
    """What TrainState.resume loads besides the policy: a component's torch file (credo.train.state._TorchFiles)
    and a component's own DeepSpeed engine (the critics), which resume loads inside weights_only_torch_load."""
    from credo.train.state import _TorchFiles

    engine, ckpt = checkpoints[1]
    marker = tmp_path / "marker"
    comp = type("Comp", (), {"load_state_dict": lambda self, s: None})()
    (tmp_path / "comp").mkdir()
    plant(tmp_path / "comp" / "rank0.pt", marker)
    with pytest.raises(UnsafeFileError, match=str(tmp_path / "comp" / "rank0.pt")):
        _TorchFiles(comp).load_files(tmp_path / "comp")
    bad = planted_copy(ckpt, "state/mp_rank_00_model_states.pt", tmp_path / "critic", marker)
    with weights_only_torch_load(), pytest.raises(UnsafeFileError, match="mp_rank_00_model_states.pt"):
        engine.load_checkpoint(str(bad), tag="state")
    assert not marker.exists()
    assert torch.load is not None and torch.load.__name__ == "load"  # the context put torch.load back


def _credo(*args: str, capsys) -> tuple[int, str]:
    """`credo ARGS` in this process (its entry point, credo.cli.main): the exit code and the last stderr line."""
    from credo.cli import main

    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()[-1]


def _credo_subprocess(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_folder():
    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model

    return build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1,
                                            intermediate_size=128))


def _planted_checkpoint(dst: Path, tiny_folder: Path, marker: Path) -> Path:
    (dst / "state").mkdir(parents=True)
    plant(dst / "state" / "mp_rank_00_model_states.pt", marker)
    (dst / "meta.json").write_text(json.dumps({"step": 1, "policy_path": str(tiny_folder)}))
    return dst


def test_credo_export_refuses_a_planted_checkpoint_and_names_the_file(tmp_path, tiny_folder, capsys):
    marker = tmp_path / "marker"
    ckpt = _planted_checkpoint(tmp_path / "step_00000001", tiny_folder, marker)
    code, last = _credo("export", str(ckpt), str(tmp_path / "out"), capsys=capsys)
    assert code == 1 and last.startswith("credo: error: refusing to load"), last
    assert str(ckpt / "state/mp_rank_00_model_states.pt") in last and "exec'" in last
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_export_refuses_a_planted_zero3_partition(checkpoints, tmp_path):
    from credo.export import checkpoint_state_dict

    _, ckpt = checkpoints[3]
    for i, rel in enumerate(f for f in _files(ckpt) if f.startswith("state/")):
        marker = tmp_path / f"marker{i}"
        bad = planted_copy(ckpt, rel, tmp_path / f"c{i}", marker)
        with pytest.raises(UnsafeFileError, match=str(bad / rel)):
            checkpoint_state_dict(bad)
        assert not marker.exists()
    assert set(checkpoint_state_dict(ckpt)) == {"weight", "bias"}


def _planted_model_folder(tiny_folder: Path, dst: Path, marker: Path) -> Path:
    shutil.copytree(tiny_folder, dst)
    (dst / "model.safetensors").unlink()  # a folder in the pickle format: transformers reads pytorch_model.bin
    torch.save({"payload": Payload(marker)}, dst / "pytorch_model.bin")
    return dst


def test_credo_eval_refuses_a_model_folder_with_a_pickled_payload(tmp_path, tiny_folder, capsys):
    marker = tmp_path / "marker"
    folder = _planted_model_folder(tiny_folder, tmp_path / "model", marker)
    code, last = _credo("eval", str(folder), "arithmetic", "task.eval_size=4", capsys=capsys)
    assert code == 1 and last.startswith("credo: error: refusing to load"), last
    assert str(folder / "pytorch_model.bin") in last and "exec'" in last and not marker.exists()


@pytest.mark.heavy  # three CLI processes (torch, transformers, DeepSpeed imports): ~1 min on a loaded machine
def test_the_credo_cli_refuses_each_planted_file_in_a_fresh_process(tmp_path, tiny_folder):
    marker = tmp_path / "marker"
    ckpt = _planted_checkpoint(tmp_path / "step_00000001", tiny_folder, marker)
    folder = _planted_model_folder(tiny_folder, tmp_path / "model", marker)
    for args, bad in [(("export", str(ckpt), str(tmp_path / "out")), ckpt / "state/mp_rank_00_model_states.pt"),
                      (("eval", str(ckpt), "arithmetic", "task.eval_size=4"), ckpt / "state/mp_rank_00_model_states.pt"),
                      (("eval", str(folder), "arithmetic", "task.eval_size=4"), folder / "pytorch_model.bin")]:
        p = _credo_subprocess(*args)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 1 and last.startswith("credo: error: refusing to load") and str(bad) in last, p.stderr
        assert "Traceback" not in p.stderr and not marker.exists()


def test_eval_of_a_planted_checkpoint_and_loading_a_planted_model_folder_refuse(tmp_path, tiny_folder, checkpoints):
    from credo.evaluation import eval_recipe, evaluate_model
    from credo.models import load_causal_lm

    marker = tmp_path / "marker"
    folder = _planted_model_folder(tiny_folder, tmp_path / "model", marker)
    with pytest.raises(UnsafeFileError, match=str(folder / "pytorch_model.bin")):
        load_causal_lm(str(folder))  # every policy, reference and export base model loads through it
    ckpt = _planted_checkpoint(tmp_path / "step_00000001", tiny_folder, marker)
    with pytest.raises(UnsafeFileError, match="mp_rank_00_model_states.pt"):
        evaluate_model(ckpt, eval_recipe("arithmetic", ["task.eval_size=4"]))
    assert not marker.exists()


def test_a_folder_of_safetensors_or_plain_weights_passes_the_check(tmp_path, tiny_folder):
    check_model_folder(tiny_folder)  # safetensors only
    folder = shutil.copytree(tiny_folder, tmp_path / "bin")
    torch.save({"w": torch.ones(2)}, folder / "pytorch_model.bin")
    check_model_folder(folder)


def test_a_checkpoint_of_an_older_credo_is_refused_by_name_and_upgrade_converts_it_exactly(checkpoints, tmp_path):
    """An older credo saved numpy's RNG state as an array: refused (naming the file and the way out), never loaded
    unsafely; `python -m credo.safe_load upgrade` (for your own checkpoint) rewrites it and the RNG resumes exactly."""
    import random

    import numpy as np

    from credo.checkpoint import rng_state, set_rng_state
    from credo.safe_load import upgrade_checkpoint

    engine, ckpt = checkpoints[1]
    old = shutil.copytree(ckpt, tmp_path / "old")
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               old / "rng_rank0.pt")  # the form credo wrote before
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    rewrite_manifest(old)
    with pytest.raises(UnsafeFileError, match=f"{old / 'rng_rank0.pt'}: its pickle names 'numpy.*upgrade {old}"):
        load_checkpoint(engine, old)
    assert upgrade_checkpoint(old) == [old / "rng_rank0.pt"]
    set_rng_state(rng_state())  # scrambled below by the load otherwise; the load must put the saved state back
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    load_checkpoint(engine, old)  # verifies the rewritten manifest, then loads weights-only
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
