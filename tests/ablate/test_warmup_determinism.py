"""What is deterministic about the SFT warm-up (docs/reproductions.md, "Warm-up determinism"): on one host, the
same recipe gives bitwise the same weights from a fresh cache, whatever the thread count; another warm-up seed
gives other weights; and the kernels' instruction set (a host's CPU) changes the bits."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from credo.config import load_recipe
from credo.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
SHORT = ["sft.steps=4", "sft.batch_size=16", "model.tiny.num_layers=1", "model.tiny.hidden_size=64", "model.tiny.num_heads=2",
         "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64"]


def warm_up(cache: Path, monkeypatch, threads: int, extra=()) -> tuple[str, dict]:
    """A warm-up from scratch (the tiny model built too) in its own cache; the sha256 of its weights and sft.json."""
    from credo.models import resolve_model_path
    from credo.sft import run_sft

    monkeypatch.setenv("CREDO_CACHE", str(cache))
    r = load_recipe(REPO / "recipes" / "quickstart.yaml", SHORT + list(extra))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, _ = run_sft(r, resolve_model_path(r.model.path, r.model.tiny), make_task(r.task), log=lambda m: None)
    finally:
        torch.set_num_threads(previous)
    return hashlib.sha256((Path(out) / "model.safetensors").read_bytes()).hexdigest(), json.loads(
        (Path(out) / "sft.json").read_text())


def test_same_host_same_recipe_gives_bitwise_the_same_warmup(tmp_path, monkeypatch):
    one, meta = warm_up(tmp_path / "c1", monkeypatch, threads=1)
    assert warm_up(tmp_path / "c2", monkeypatch, threads=1)[0] == one  # a fresh cache: model and warm-up rebuilt
    assert warm_up(tmp_path / "c3", monkeypatch, threads=2)[0] == one  # the thread count does not change a bit
    assert warm_up(tmp_path / "c4", monkeypatch, threads=1, extra=["sft.seed=1"])[0] != one  # the data order does
    assert meta["made_by"]["threads"] == 1 and meta["made_by"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow  # two fresh interpreters: ~30 s
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512", reason="needs an AVX-512 host to compare with AVX2")
def test_the_cpu_instruction_set_changes_the_warmup(tmp_path):
    """The cross-host difference reproduced on one host: the same recipe under torch's AVX2 kernels
    (ATEN_CPU_CAPABILITY=avx2, what an AVX2-only CPU runs) warms up to other weights than under AVX-512."""
    code = ("import hashlib, sys; from pathlib import Path; from credo.config import load_recipe; "
            "from credo.models import resolve_model_path; from credo.tasks import make_task; "
            "from credo.sft import run_sft; import torch; torch.set_num_threads(1); "
            f"r = load_recipe({str(REPO / 'recipes' / 'quickstart.yaml')!r}, {SHORT!r}); "
            "out, _ = run_sft(r, resolve_model_path('tiny', r.model.tiny), make_task(r.task), log=lambda m: None); "
            "print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256((Path(out) / 'model.safetensors').read_bytes()).hexdigest())")
    digests = {}
    for cap in ("avx512", "avx2"):
        env = dict(os.environ, CREDO_CACHE=str(tmp_path / cap), ATEN_CPU_CAPABILITY=cap, PYTHONPATH=str(REPO))
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        reported, digests[cap] = p.stdout.split()[-2:]
        assert reported == cap.upper()
    assert digests["avx512"] != digests["avx2"]


def test_the_cache_key_records_the_kernels(tmp_path, monkeypatch):
    """A warm-up made under other kernels is another cache entry, never reused as this host's; threads are not in it."""
    from credo.sft import sft_cache_key

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    r = load_recipe(REPO / "recipes" / "quickstart.yaml", SHORT)
    key = sft_cache_key(r, "tiny")
    torch.set_num_threads(torch.get_num_threads())  # unchanged, but set: the key must not follow it either way
    assert sft_cache_key(load_recipe(REPO / "recipes" / "quickstart.yaml", SHORT + ["run.threads=1"]), "tiny") == key
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert sft_cache_key(r, "tiny") != key
    monkeypatch.delenv("MKL_CBWR")
    other = {"AVX512": "AVX2"}.get(torch.backends.cpu.get_cpu_capability(), "AVX512")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)  # as another host reports it
    assert sft_cache_key(r, "tiny") != key


def test_the_cache_key_records_the_cpu_vendor_and_isa(tmp_path, monkeypatch):
    """An Intel host told to run torch's AVX2 kernels reports the capability of an AMD AVX2 host but trains other
    weights (MKL picks its path by vendor and hardware ISA): the key must differ between the two."""
    import credo.sft as sft

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    r = load_recipe(REPO / "recipes" / "quickstart.yaml", SHORT)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(sft, "cpu_identity", lambda: {"vendor": "GenuineIntel", "isa": "avx512"})
    intel = sft.sft_cache_key(r, "tiny")
    monkeypatch.setattr(sft, "cpu_identity", lambda: {"vendor": "AuthenticAMD", "isa": "avx2"})
    assert sft.sft_cache_key(r, "tiny") != intel
    monkeypatch.setattr(sft, "cpu_identity", lambda: {"vendor": "GenuineIntel", "isa": "avx2"})
    assert sft.sft_cache_key(r, "tiny") != intel
    monkeypatch.setattr(sft, "cpu_identity", lambda: {"vendor": "GenuineIntel", "isa": "avx512"})
    assert sft.sft_cache_key(r, "tiny") == intel
    for name in sft.KERNEL_ENV:  # each steers MKL's or oneDNN's path: MKL_ENABLE_INSTRUCTIONS=AVX2 changes the bits
        monkeypatch.setenv(name, "AVX2")
        assert sft.sft_cache_key(r, "tiny") != intel, name
        monkeypatch.delenv(name)


def test_cpu_identity_reads_vendor_and_widest_isa(tmp_path):
    from credo.sft import cpu_identity

    amd = tmp_path / "amd"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
                   "processor\t: 1\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx avx2 fma\n")
    assert cpu_identity(amd) == {"vendor": "AuthenticAMD", "isa": "avx2"}
    intel = tmp_path / "intel"
    intel.write_text("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx avx2 avx512f avx512bw\n")
    assert cpu_identity(intel) == {"vendor": "GenuineIntel", "isa": "avx512"}
    assert cpu_identity(tmp_path / "absent")["isa"] is None
