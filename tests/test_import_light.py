"""credo.algos and credo.credit import only torch, einops and the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("deepspeed", "vllm", "transformers")


def test_import_is_light():
    code = (
        "import sys, credo.algos, credo.credit\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
