"""credo.algos and credo.credit import only torch, einops and the standard library, and respect their layering."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HEAVY = ("deepspeed", "vllm", "transformers", "ray")


def test_import_is_light():
    code = (
        "import sys, credo, credo.algos, credo.credit, credo.config\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# Layering between the two pure packages: credo.algos imports nothing from credo.credit, and
# credo.credit uses only public (non-underscore) names of credo.algos.

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "credo"


def test_importing_algos_loads_no_credit_module_and_registers_ipa():
    code = (
        "import sys, credo.algos\n"
        "loaded = sorted(m for m in sys.modules if m == 'credo.credit' or m.startswith('credo.credit.'))\n"
        "assert not loaded, loaded\n"
        "assert 'ipa' in credo.algos.POLICY_LOSSES\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _absolute(module: str | None, level: int, package: str) -> str:
    """The absolute name of ``from <.. * level><module> import ...`` written in ``package``."""
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _dotted(node) -> str | None:
    """``a.b.c`` for an Attribute/Name chain, None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def layering_violations(source: str, package: str, filename: str = "<src>") -> list[str]:
    """Imports of credo.credit from credo.algos, and uses of credo.algos' private names from
    credo.credit, in one module's source (``package`` is the module's package, e.g. credo.credit)."""
    tree = ast.parse(source, filename)
    out = []
    algos_aliases = set()  # local names bound to credo.algos or to something imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(a.name, a.asname or a.name.split(".")[0]) for a in node.names]
            imported = []
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            modules = [(f"{base}.{a.name}", a.asname or a.name) for a in node.names]
            imported = [a.name for a in node.names]
        else:
            continue
        for full, local in modules:
            where = f"{filename}:{node.lineno}"
            if package.startswith("credo.algos") and (full == "credo.credit" or full.startswith("credo.credit.")):
                out.append(f"{where} credo.algos imports {full}")
            if package.startswith("credo.credit") and full.startswith("credo.algos"):
                if any(_is_private(p) for p in full.split(".")):
                    out.append(f"{where} credo.credit uses the private name {full}")
                algos_aliases.add(local)
        if isinstance(node, ast.ImportFrom) and package.startswith("credo.algos"):
            base = _absolute(node.module, node.level, package)
            if base == "credo" and "credit" in imported:
                out.append(f"{filename}:{node.lineno} credo.algos imports credo.credit")
    if package.startswith("credo.credit"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if dotted is None:
                    continue
                head, *rest = dotted.split(".")
                if (head in algos_aliases or dotted.startswith("credo.algos")) and any(_is_private(p) for p in rest):
                    out.append(f"{filename}:{node.lineno} credo.credit uses the private name {dotted}")
    return out


def test_layering_checker_flags_violations():
    credit_bad = (
        "from credo.algos._validate import check_like\n"
        "from credo.algos.policy_losses import _frac\n"
        "import credo.algos.policy_losses as pl\n"
        "from credo.algos import chunks\n"
        "x = pl._frac\n"
        "y = chunks._check_2d\n"
        "z = credo.algos._validate.check_like\n"
    )
    lines = {int(v.split(":")[1].split()[0]) for v in layering_violations(credit_bad, "credo.credit")}
    assert lines == {1, 2, 5, 6, 7}
    algos_bad = (
        "import credo.credit.ipa\n"
        "from credo.credit.chunks import chunk_ids\n"
        "from credo import credit\n"
        "from ..credit import flow\n"
    )
    lines = {int(v.split(":")[1].split()[0]) for v in layering_violations(algos_bad, "credo.algos")}
    assert lines == {1, 2, 3, 4}
    fine = "from credo.algos.chunks import chunk_ids\nfrom credo.algos import ipa_loss\nimport torch\nx = torch._C\n"
    assert layering_violations(fine, "credo.credit") == []


def test_algos_and_credit_respect_the_layering():
    found = []
    for package in ("algos", "credit"):
        for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
            found += layering_violations(path.read_text(), f"credo.{package}", str(path.relative_to(PACKAGE_ROOT)))
    assert not found, found
